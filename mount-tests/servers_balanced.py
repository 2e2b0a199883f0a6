#!/usr/bin/env python3
"""BIN ADDRS: every memory server of ADDRS (commas) within 10% of the mean used fraction
(ops.sh add_server's rebalance). Prints the fractions; exits non-zero when one is not.
"""
import json, subprocess, sys
used = []
for a in sys.argv[2].split(","):
    s = json.loads(subprocess.run([sys.argv[1], "stats", "--server", a, "--json"], check=True,
                                  capture_output=True).stdout)
    used.append((s["total_bytes"] - s["free_bytes"]) / s["total_bytes"])
mean = sum(used) / len(used)
print("used fractions", ["%.3f" % u for u in used], "mean %.3f" % mean)
sys.exit(0 if all(abs(u - mean) <= 0.1 * mean for u in used) else "not within 10% of the mean")
