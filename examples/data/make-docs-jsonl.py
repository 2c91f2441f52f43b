#!/usr/bin/env python3
"""Builds examples/data/forge-docs.jsonl: the paragraphs of the project's own documentation as
{"text": ...} lines, a small dataset of our own writing that ./finetune's README run trains on.

    python3 examples/data/make-docs-jsonl.py README.md docs/*.md > examples/data/forge-docs.jsonl

A paragraph is a run of non-blank lines; code blocks stay whole; paragraphs shorter than 80
characters (headings, one-line lists) are merged into the next one.
"""
import json
import sys


def paragraphs(text):
    out, cur, fence = [], [], False
    for line in text.splitlines():
        if line.startswith("```"):
            fence = not fence
        if not line.strip() and not fence:
            if cur:
                out.append("\n".join(cur))
            cur = []
        else:
            cur.append(line.rstrip())
    if cur:
        out.append("\n".join(cur))
    return out


def main():
    carry = ""
    for path in sys.argv[1:]:
        with open(path, encoding="utf-8") as f:
            for p in paragraphs(f.read()):
                p = (carry + "\n\n" + p) if carry else p
                if len(p) < 80:
                    carry = p
                    continue
                carry = ""
                print(json.dumps({"text": p}, ensure_ascii=False))


if __name__ == "__main__":
    main()
