"""The one reader of fio's JSON output for the lab's scripts (run from the repository root:
`sys.path.insert(0, "lab/scripts"); from fio_result import fio_job, fio_side`)."""

import json


def fio_job(path):
    """The first job of fio's JSON output at PATH (fio may print notes before the JSON)."""
    text = open(path).read()
    return json.loads(text[text.index("{"):])["jobs"][0]


def fio_side(path, job=None, rw=None):
    """The figures of one direction of the first job at PATH: `rw` ("read" or "write"), or the
    read side when the job's name says read, else the write side (seq-fresh, seq-overwrite
    and rand-write write). Bandwidth in MB/s (10^6) and MiB/s, IOPS, completion latency
    percentiles and mean in microseconds, and fio's own record of that side (`raw`)."""
    if rw is None:
        rw = "read" if job is None or "read" in job else "write"
    side = fio_job(path)[rw]
    clat = side.get("clat_ns", {})
    pct = clat.get("percentile", {})
    return {
        "mb_s": side["bw_bytes"] / 1e6,
        "mib_s": side["bw_bytes"] / 2**20,
        "iops": side["iops"],
        "p50_us": pct.get("50.000000", 0) / 1e3,
        "p99_us": pct.get("99.000000", 0) / 1e3,
        "mean_us": clat.get("mean", 0) / 1e3,
        "max_s": clat.get("max", 0) / 1e9,
        "raw": side,
    }
