#!/usr/bin/env python3
"""Streams the text column of Parquet files (the format of Hugging Face datasets) as JSON lines
on standard output, for `ustrain data prep ... -` to read:

  scripts/parquet-text.py [--column text] FILE.parquet... | ustrain data prep --out DIR -

Rows are read a record batch at a time (memory stays flat for large files), in file order; null
texts are skipped. Needs pyarrow (`pip install pyarrow`), which ustrain itself never needs."""
import argparse
import json
import sys


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--column", default="text", help="the column holding the text (default: text)")
    ap.add_argument("files", nargs="+")
    args = ap.parse_args()
    try:
        import pyarrow.parquet as pq
    except ImportError:
        sys.exit("parquet-text.py: pyarrow is not installed (pip install pyarrow)")
    out = sys.stdout
    for path in args.files:
        f = pq.ParquetFile(path)
        if args.column not in f.schema_arrow.names:
            sys.exit(f"parquet-text.py: {path} has no column '{args.column}' "
                     f"(columns: {', '.join(f.schema_arrow.names)}; choose one with --column)")
        for batch in f.iter_batches(columns=[args.column], batch_size=4096):
            for text in batch.column(0).to_pylist():
                if text is not None:
                    out.write(json.dumps({"text": text}, ensure_ascii=False) + "\n")
    out.flush()


if __name__ == "__main__":
    main()
