"""Feeds parc one hostile input and checks that it ends the way every bad input must: exit
code 1, at least one diagnostic, within the time limit and without overflowing a stack of
half the usual size.

usage: hostile.py CASE WORKDIR
Prints "exit 1" and the first diagnostic (cut to 160 characters) for FileCheck; anything else
is printed as a failure and the script exits 1.
"""
import os
import random
import resource
import subprocess
import sys
import time

MB = 1 << 20
# A sanitizer build runs several times slower; scripts/sanitize.sh scales the limit.
TIME_LIMIT_S = 20 * float(os.environ.get("PARC_TEST_TIME_SCALE", "1"))
STACK_BYTES = 4 * MB


def model(value):
    return b"model m {\n  hidden = " + value + b"\n}\n"


def include_chain(workdir, depth):
    for i in range(depth):
        with open(os.path.join(workdir, f"chain{i}.par"), "w") as f:
            f.write(f'include "chain{i + 1}.par"\n')
    with open(os.path.join(workdir, f"chain{depth}.par"), "w") as f:
        f.write("# the end of the chain\n")
    return b'include "chain0.par"\n'


def generate(case, workdir):
    rng = random.Random(2024)
    if case == "empty":
        return b""
    if case == "binary-garbage":
        return bytes(rng.randrange(256) for _ in range(64 * 1024))
    if case == "nul-bytes":
        return b"model m {\n  hidden = 1\x00\x00\x00\n}\n"
    if case == "invalid-utf8":
        return b"model m {\n  hidden = 1 # caf\xc3\x28 \xff\xfe\n}\n"
    if case == "truncated-utf8":
        return b"model m {\n  hidden = 1 # \xe6\x97\n"
    if case == "carriage-returns":
        return b"model m {\r  hidden = 1\r}\r"
    if case == "line-1mb-comment":
        return b"#" + b"x" * MB + b"\n"
    if case == "line-1mb-identifier":
        return model(b"h" * MB)
    if case == "line-1mb-number":
        return model(b"7" * MB)
    if case == "line-1mb-expression":
        return model(b"1+" * (MB // 2) + b"1")
    if case == "line-1mb-string":
        return model(b'"' + b"s" * MB + b'"')
    if case == "line-1mb-unterminated-string":
        return model(b'"' + b"s" * MB)
    if case == "line-1mb-statements":
        return b"model m {" + b" f = 1;" * (MB // 7) + b"}\n"
    if case == "nested-parens-100000":
        return model(b"(" * 100000 + b"1" + b")" * 100000)
    if case == "unclosed-parens-100000":
        return model(b"(" * 100000)
    if case == "nested-brackets-100000":
        return model(b"[" * 100000 + b"]" * 100000)
    if case == "nested-braces-100000":
        return b"model m " + b"{ a " * 100000 + b"}" * 100000 + b"\n"
    if case == "nested-signs-100000":
        return model(b"-" * 100000 + b"1")
    if case == "closing-braces-100000":
        return b"}" * 100000 + b"\n"
    if case == "literal-1e30":
        return model(b"1000000000000000000000000000000")
    if case == "literal-exponent-overflow":
        return model(b"1e999999")
    if case == "many-statements":
        return b"model m {\n" + b"  f = 1\n" * 200000 + b"}\n"
    if case == "many-blocks":
        return b"".join(b"model m%d { }\n" % i for i in range(20000))
    if case == "include-chain-100":
        return include_chain(workdir, 100)
    raise SystemExit(f"unknown case {case}")


def limit_stack():
    resource.setrlimit(resource.RLIMIT_STACK, (STACK_BYTES, STACK_BYTES))


def main():
    case, workdir = sys.argv[1], sys.argv[2]
    os.makedirs(workdir, exist_ok=True)
    path = os.path.join(workdir, case + ".par")
    with open(path, "wb") as f:
        f.write(generate(case, workdir))
    start = time.monotonic()
    try:
        run = subprocess.run(["parc", path], capture_output=True, timeout=TIME_LIMIT_S,
                             preexec_fn=limit_stack)
    except subprocess.TimeoutExpired:
        print(f"FAIL: {case}: no answer within {TIME_LIMIT_S:g} s")
        return 1
    elapsed = time.monotonic() - start
    stderr = run.stderr.decode("utf-8", "replace")
    lines = [line for line in stderr.splitlines() if "error:" in line]
    if run.returncode != 1 or not lines:
        print(f"FAIL: {case}: exit code {run.returncode} after {elapsed:.1f} s, "
              f"stderr starts {stderr[:300]!r}")
        return 1
    print("exit 1")
    first = lines[0].replace(path, "INPUT").replace(os.path.join(workdir, ""), "")
    print(first[:160])
    return 0


if __name__ == "__main__":
    sys.exit(main())
