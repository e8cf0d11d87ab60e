"""`data=parquet`: Parquet files, one record a row (text documents in data.text_key, or chat records), read a
row group at a time through pyarrow and prepared into a dataset at launch. `prepare` reads .parquet inputs
through it."""
from __future__ import annotations

from typing import Iterator

from framework.data.documents import DocumentError
from framework.data.sources.prepared import PreparedSource


class Parquet(PreparedSource):
    name = "parquet"
    reads_with = ("Parquet files are read by", "pyarrow", "parquet")

    def reads(self, path: str) -> bool:
        return path.endswith(".parquet")

    def records(self, path: str, columns: list[str] | None = None,
                split: str = "train") -> Iterator[tuple[str, object]]:
        try:
            import pyarrow.parquet as pq
        except ImportError:
            raise DocumentError(f"{path}: reading Parquet needs pyarrow: pip install 'framework[parquet]'") from None
        try:
            parquet = pq.ParquetFile(path)
        except Exception as e:
            raise DocumentError(f"{path}: not a Parquet file ({str(e).splitlines()[0][:120]})") from None
        names = parquet.schema_arrow.names
        missing = [c for c in columns or () if c not in names]
        if missing:
            raise DocumentError(f"{path}: no column {missing[0]!r} (columns: {', '.join(names)}); pass --text-key")
        row = 0
        for group in range(parquet.num_row_groups):
            for record in parquet.read_row_group(group, columns=columns).to_pylist():
                row += 1
                # a null text is an empty document, as an empty string would be
                yield f"{path}:row {row}", {k: ("" if v is None and columns else v) for k, v in record.items()}
