"""Prefixes each line of standard input with the seconds since T0 (a `date +%s.%N` reading): the
server's log in run.sh, so its start-up phases and the worker's lines show when they happened.

    command 2>&1 | python3 -u bench/gpu/serve/stamp.py T0 > server.log
"""
import sys
import time


def main():
    t0 = float(sys.argv[1])
    for line in sys.stdin:
        sys.stdout.write("%8.2f  %s" % (time.time() - t0, line))


if __name__ == "__main__":
    main()
