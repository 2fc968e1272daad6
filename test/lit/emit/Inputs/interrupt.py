#!/usr/bin/env python3
"""interrupt.py SIGNAL OUT -- PARC ARGS...: starts `PARC ARGS` (a `parc ... -o OUT`), sends
SIGNAL as soon as its temporary directory OUT.parc-tmp-* exists, and prints how parc ended and
which of OUT's siblings are left, so that a test can check that nothing is."""
import glob
import os
import signal
import subprocess
import sys
import time

signame, out = sys.argv[1], sys.argv[2]
command = sys.argv[sys.argv.index("--") + 1:]
parc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
deadline = time.monotonic() + 120
while not glob.glob(out + ".parc-tmp-*") and parc.poll() is None and time.monotonic() < deadline:
    time.sleep(0.001)
seen = bool(glob.glob(out + ".parc-tmp-*"))
parc.send_signal(getattr(signal, signame))
status = parc.wait()
print("temporary seen" if seen else "no temporary seen (parc ended first)")
print(f"ended by {signal.Signals(-status).name}" if status < 0 else f"exit {status}")
left = sorted(os.path.basename(p) for p in glob.glob(out + ".*"))
print("left: " + (" ".join(left) if left else "nothing"))
