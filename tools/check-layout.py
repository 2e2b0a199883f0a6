#!/usr/bin/env python3
"""Checks that the map of the code is whole: every file under src/ is named in doc/DESIGN.md's
layout, and every module src/lib.rs declares is named (as [`name`]) in its doc.

A file is named when its path appears in the layout, or an entry of the layout covers its
folder (`src/fuse/`, or `src/fabric/mod.rs` for src/fabric/) and names it relative to that
folder (`ops.rs`, `journal/writer.rs`). Prints what is missing; exits non-zero if anything is.
"""
import os
import re
import sys

root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
design = open(os.path.join(root, "doc/DESIGN.md")).read()
block = design.split("## Layout", 1)[1].split("```", 2)[1]

entries = []  # (key, text)
for line in block.splitlines():
    if line and not line[0].isspace():
        key, _, text = line.partition(" ")
        entries.append([key, text])
    elif entries:
        entries[-1][1] += " " + line.strip()


def named(path):
    if re.search(r"(^|[\s(,])" + re.escape(path) + r"\b", block):
        return True
    for key, text in entries:
        folders = []
        if key.endswith("/"):
            folders.append(key)
        elif key.endswith(".rs"):
            folders.append(os.path.dirname(key) + "/")
        for folder in folders:
            if path.startswith(folder):
                rest = path[len(folder):]
                if re.search(r"(^|[\s(,:;])" + re.escape(rest) + r"(?![\w/])", text):
                    return True
    return False


missing = []
for dirpath, _, files in os.walk(os.path.join(root, "src")):
    for f in files:
        if f.endswith(".rs"):
            path = os.path.relpath(os.path.join(dirpath, f), root)
            if not named(path):
                missing.append(path)

lib = open(os.path.join(root, "src/lib.rs")).read()
doc = "\n".join(l for l in lib.splitlines() if l.startswith("//!"))
modules = re.findall(r"^\s*(?:pub(?:\(crate\))? )?mod (\w+);", lib, re.M)
unmapped = [m for m in modules if f"[`{m}`]" not in doc]

for path in sorted(missing):
    print(f"doc/DESIGN.md's layout does not name {path}")
for m in unmapped:
    print(f"src/lib.rs's doc does not name the module [`{m}`]")
if missing or unmapped:
    sys.exit(1)
print(f"the map is whole: {len(modules)} modules in src/lib.rs, every file under src/ in doc/DESIGN.md")
