"""Sample /proc/stat's cpu line every 20 ms until SIGTERM: unix time, busy, idle+iowait jiffies.

Usage: ``python statsample.py OUT.txt &``, the job, then ``kill %1``. The runs here were
recorded with an earlier form of it that did the same but flushed its file on SIGTERM
instead of closing it (validation/README.md).
"""

import signal
import sys
import time


def main() -> None:
    out = open(sys.argv[1], "w")  # noqa: SIM115 - closed by the SIGTERM handler
    signal.signal(signal.SIGTERM, lambda *_: (out.close(), sys.exit(0)))
    while True:
        with open("/proc/stat") as f:
            v = list(map(int, f.readline().split()[1:]))
        idle = v[3] + v[4]
        out.write(f"{time.time():.4f} {sum(v) - idle} {idle}\n")
        time.sleep(0.02)


if __name__ == "__main__":
    main()
