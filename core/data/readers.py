"""Reading raw rows (lists of dicts) from local files, ``datasets`` folders and the local cache.

Nothing here downloads: files are read from disk, ``datasets`` folders with ``load_from_disk``,
and ``datasets`` names only from the local cache with the Hub switched offline for the call.
Every failure is a :class:`~policyzoo.errors.DataError` (where / why / fix).
"""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path

from policyzoo.errors import DataError, did_you_mean

FORMATS = {".json": "JSON (a list of objects)", ".jsonl": "JSON Lines (one object per line)",
           ".csv": "CSV (a header line, then one row per line)", ".parquet": "Parquet"}
BUILDERS = {".json": "json", ".jsonl": "json", ".csv": "csv", ".parquet": "parquet"}


def read_path(path: str, split: str, where: str = "data.path") -> list[dict]:
    """Rows of a local file (by extension: ``.json`` by the json module, which checks it holds one
    list of objects; the others with ``datasets.load_dataset``), of a folder
    written by ``save_to_disk`` (``split`` picks one split of a saved ``DatasetDict``), or of a
    folder of data files (``load_dataset(folder)``: files named after their split, e.g.
    ``train.jsonl`` and ``test.jsonl``). Without the ``datasets`` package, JSON, JSON Lines and
    Parquet files are still read (by the json module and pyarrow)."""
    p = Path(path).expanduser()
    if not p.exists():
        raise DataError(where, f"no such file or folder: {p.resolve()}",
                        f"check the path (a relative path is read from {Path.cwd()})")
    if p.is_dir():
        if not any((p / n).exists() for n in ("dataset_dict.json", "dataset_info.json", "state.json")):
            return _from_datasets_object(_load_dataset(str(p), {}, p, where, split=None), split, where)
        return _from_datasets_object(_load_from_disk(p, where), split, where)
    suffix = p.suffix.lower()
    if suffix not in FORMATS:
        raise DataError(where, f"unknown data format {suffix or '(no extension)'!r} of {p.name}",
                        "use one of: " + ", ".join(f"{k} = {v}" for k, v in FORMATS.items())
                        + ", or a folder written by datasets' save_to_disk")
    if suffix == ".json":  # one list of objects (load_dataset would also take a lone object as one row)
        return _read_json(p, where)
    try:
        import datasets  # noqa: F401
    except ImportError:
        if suffix == ".csv":
            _import_datasets(where)  # raises: CSV is read by datasets only
        return {".jsonl": _read_jsonl, ".json": _read_json, ".parquet": _read_parquet}[suffix](p, where)
    try:
        return _load_dataset(BUILDERS[suffix], {"data_files": str(p)}, p, where, split="train").to_list()
    except DataError:
        if suffix == ".jsonl":  # name the bad line, or read rows whose columns differ from row to row
            return _read_jsonl(p, where)
        raise


def _load_dataset(builder: str, kwargs: dict, p: Path, where: str, split: str | None):
    datasets = _import_datasets(where)
    quiet, level = datasets.utils.are_progress_bars_disabled(), datasets.logging.get_verbosity()
    datasets.disable_progress_bars()  # "Generating train split" bars say nothing about a local file
    datasets.logging.set_verbosity(datasets.logging.CRITICAL)  # its errors become one DataError here
    with _hub_offline():
        try:
            return datasets.load_dataset(builder, split=split, **kwargs)
        except Exception as e:  # datasets raises many types for a file it cannot read
            raise DataError(f"{where}: {p.name}", f"datasets.load_dataset could not read it ({type(e).__name__}: "
                            f"{str(e)[:300]})", "check the file's format (" + ", ".join(
                                f"{k} = {v}" for k, v in FORMATS.items()) + ")") from None
        finally:
            datasets.logging.set_verbosity(level)
            if not quiet:
                datasets.enable_progress_bars()


def _read_jsonl(p: Path, where: str) -> list[dict]:
    rows = []
    with p.open(encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise DataError(f"{where}: {p.name} line {lineno}", f"not valid JSON: {e.msg}",
                                "write one JSON object per line") from None
            if not isinstance(row, dict):
                raise DataError(f"{where}: {p.name} line {lineno}", f"expected a JSON object, got "
                                f"{type(row).__name__}", 'write lines like {"prompt": ..., "answer": ...}')
            rows.append(row)
    return rows


def _read_json(p: Path, where: str) -> list[dict]:
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise DataError(f"{where}: {p.name} line {e.lineno}", f"not valid JSON: {e.msg}",
                        "a .json file holds one list of objects; use .jsonl for one object per line") from None
    if not isinstance(data, list) or not all(isinstance(r, dict) for r in data):
        raise DataError(f"{where}: {p.name}", f"expected a list of objects, got {type(data).__name__}",
                        'write [{"prompt": ..., "answer": ...}, ...] or use JSON Lines (.jsonl)')
    return data


def _read_parquet(p: Path, where: str) -> list[dict]:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise DataError(where, "reading Parquet needs the pyarrow package, which is not installed",
                        "pip install pyarrow  (or: pip install 'policyzoo[data]')") from None
    try:
        return pq.read_table(p).to_pylist()
    except Exception as e:  # pyarrow raises several types for a damaged file
        raise DataError(f"{where}: {p.name}", f"not a readable Parquet file: {e}",
                        "write it with pandas.DataFrame.to_parquet or pyarrow.parquet.write_table") from None


def _import_datasets(where: str):
    try:
        import datasets
    except ImportError:
        raise DataError(where, "this source needs the `datasets` package, which is not installed",
                        "pip install datasets  (or: pip install 'policyzoo[data]'), or use a .jsonl file") from None
    return datasets


def _load_from_disk(p: Path, where: str):
    datasets = _import_datasets(where)
    try:
        return datasets.load_from_disk(str(p))
    except FileNotFoundError as e:
        raise DataError(where, f"{p} is a folder but not a saved data set: {e}",
                        "point data.path at a file, or at a folder written by Dataset.save_to_disk") from None


def _from_datasets_object(obj, split: str, where: str) -> list[dict]:
    if isinstance(obj, dict):  # a DatasetDict (a dict of splits)
        splits = list(obj.keys())
        if split not in splits:
            raise DataError(f"{where} (split)", f"no split {split!r}{did_you_mean(split, splits)}; "
                            f"the data set has: {', '.join(splits)}", "set data.split to one of those")
        obj = obj[split]
    return obj.to_list()


@contextlib.contextmanager
def _hub_offline():
    """Switch the Hub off for one call, whatever the environment says (restored after)."""
    import datasets.config as dcfg
    import huggingface_hub.constants as hc

    saved = dcfg.HF_HUB_OFFLINE, hc.HF_HUB_OFFLINE, os.environ.get("HF_HUB_OFFLINE")
    dcfg.HF_HUB_OFFLINE = hc.HF_HUB_OFFLINE = True
    os.environ["HF_HUB_OFFLINE"] = "1"
    try:
        yield
    finally:
        dcfg.HF_HUB_OFFLINE, hc.HF_HUB_OFFLINE = saved[0], saved[1]
        if saved[2] is None:
            os.environ.pop("HF_HUB_OFFLINE", None)
        else:
            os.environ["HF_HUB_OFFLINE"] = saved[2]


def read_cached_dataset(name: str, split: str, where: str = "data.name") -> list[dict]:
    """Rows of a ``datasets`` data set that is already in the local cache (never downloads)."""
    datasets = _import_datasets(where)
    with _hub_offline():
        try:
            ds = datasets.load_dataset(name, split=split)
        except Exception as e:  # datasets raises many types when a name is not cached
            raise DataError(where, f"{name!r} is not a built-in task and could not be loaded from the local "
                            f"`datasets` cache without downloading ({type(e).__name__}: {str(e)[:200]})",
                            "use name: arithmetic or gsm8k, point data.path at a local file, or save the "
                            "data set once with Dataset.save_to_disk and set data.path to that folder") from None
    return ds.to_list()
