# Reads parrun --profile's table: do the rows' ms/step add up to the step's, and their shares
# to 100 %? Each printed figure is rounded (ms to 0.001, shares to 0.1), so each row may be
# off by half a unit.
/^profile / { table = 1; next }
/^memory / { table = 0 }
table && /^  step / { step = $(NF - 2); next }
table && /^  / && $1 != "op" { ms += $(NF - 2); share += $(NF - 1); rows++ }
function abs(x) { return x < 0 ? -x : x }
END {
  if (rows == 0) { print "no profile table"; exit 1 }
  if (abs(ms - step) > 0.0005 * rows + 1e-9 || abs(share - 100) > 0.05 * rows + 1e-9) {
    printf "the rows add to %.3f ms and %.1f %%, the step is %.3f ms\n", ms, share, step
    exit 1
  }
  print "the rows add up to the step"
}
