"""Issue 11's side-by-side bench: vitexport, NNCF, ModelOpt (twice) and plain ``quantize_static`` on
the cases of :mod:`bench.cases`, every tool given the same FP32 ONNX and the same calibration file.

Per case and calibration size ``n`` (:class:`bench.plan.CasePlan`):

1. ``prep|CASE``: train or build the case, write its three splits and the torch reference.
2. ``calib-N.npz``: the ``n`` samples every tool calibrates on.
3. ``vx|CASE|N``: ``vitexport.api.export(uri, "orin", weights, calib=calib-N.npz, parity_data=parity.npz)``,
   nothing overridden but ``calibration.num_samples=N`` (the recipe's own value in the headline): its
   gate verdict is the exit code ``vitexport export --target orin`` would have (1 = gate failed).
4. ``nncf|…``, ``mo_fp16|…``, ``mo_fp32|…`` in the peers' venv (:mod:`bench.peers`), ``plain|…``
   (``quantize_static``, MinMax, QDQ, per-channel) — all on vitexport's ``model.fp32.onnx``.
5. ``q|RID``: each INT8 file scored on ``score.npz`` (no tool saw it), Q/DQ as float, vs torch.
6. ``lat|CASE``: ONNX Runtime CPU latency of the FP32 and every INT8 file.

Records are keyed by their inputs' content: a vitexport record by a digest of ``vitexport/`` (its code
and the recipes it ships in ``vitexport/targets/``: a code or recipe change re-measures it), a peer's
by the digests of the FP32 file and calibration file it got (unchanged → its record stands). So ``--resume`` after editing the quantizer re-runs
vitexport, its scoring and the latency, and keeps every peer's figures.
"""
from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

from .cases import CASES, file_digest, write_calib_subset
from .plan import CasePlan
from .proc import REPO
from .harness import Bench

__all__ = ["CaseBench", "PEERS_PYTHON", "code_digest", "PEER_TASKS"]

PEERS_PYTHON = REPO / "bench" / ".peers-venv" / "bin" / "python"
#: path → (peers task, extra arguments)
PEER_TASKS = {"nncf": ("nncf", {}), "mo_fp16": ("modelopt", {}), "mo_fp32": ("modelopt", {"high_precision_dtype": "fp32"})}


def code_digest(*roots: Path, patterns: tuple[str, ...] = ("*.py", "*.yaml")) -> str:
    """A digest of every matching file under ``roots`` (names and bytes), for record keys."""
    h = hashlib.sha256()
    for root in roots:
        files = [root] if root.is_file() else sorted(p for pat in patterns for p in root.rglob(pat) if "__pycache__" not in p.parts)
        for p in files:
            h.update(str(p.relative_to(REPO)).encode())
            h.update(p.read_bytes())
    return h.hexdigest()[:16]


class CaseBench(Bench):
    """Walks a :class:`~bench.plan.CasePlan`; ``paths``: the tools to measure now (others' records stand);
    ``extra_only``: only the extra cells (ViT-B/16 at 256 samples: memory and quantize time beside NNCF)."""

    def __init__(self, plan: CasePlan, work: Path, cap_gb: float, resume: bool, log=print,
                 paths: tuple[str, ...] | None = None, latency: bool = True, peers_python: Path = PEERS_PYTHON,
                 extra_only: bool = False):
        super().__init__(plan, work, cap_gb, resume, log)
        self.extra_only = extra_only
        self.paths = tuple(paths or plan.paths)
        self.latency = latency
        self.peers_python = Path(peers_python)
        self.vx_code = code_digest(REPO / "vitexport")  # vitexport/targets/*.yaml: the recipes a run loads

    # --- one cell per tool ------------------------------------------------------------------------
    def _skip(self, rid: str, why: str) -> dict:
        rec = {"ok": False, "skipped": True, "error": why}
        self.records[rid] = rec
        self._save()
        return rec

    def prepare_case(self, case: str) -> dict:
        spec = CASES[case]
        code = [REPO / "bench" / "cases.py", REPO / "bench" / "arch.py", REPO / "bench" / "models.py"]
        if spec.script:
            code += [REPO / "scripts" / spec.script, REPO / "scripts" / "_train_common.py"]
        if spec.kind in ("detection", "segmentation"):  # their splits are made (and widened) there
            code += [REPO / "bench" / "dense_case.py", REPO / "bench" / "dense.py"]
        args = {"case": case, "work": str(self.work / case), "max_calib": self.plan.max_calib(case),
                "sizes": self.plan.sizes.get(case), "tiny": self.plan.tiny, "code": code_digest(*code)}
        return self.measure(f"prep|{case}", "prepare_case", args)

    def calib_file(self, case: str, prep: dict, n: int) -> tuple[str, str]:
        """``calib-N.npz`` (rewritten when its source changed) and its digest."""
        dst = self.work / case / f"calib-{n}.npz"
        src_digest = file_digest(prep["calib"])
        stamp = dst.with_suffix(".src")
        if not dst.is_file() or not stamp.is_file() or stamp.read_text() != src_digest:
            write_calib_subset(Path(prep["calib"]), dst, n)
            stamp.write_text(src_digest)
        return str(dst), file_digest(dst)

    def vx(self, case: str, prep: dict, n: int, calib: tuple[str, str]) -> dict:
        rid = f"vx|{case}|{n}"
        out = self.work / case / f"vx-{n}"
        args = {"uri": prep["uri"], "weights": prep["weights"], "calib": calib[0], "calib_digest": calib[1],
                "parity": prep["parity"], "parity_digest": file_digest(prep["parity"]), "out": str(out), "target": "orin", "num_samples": n, "resume": False,
                "code": self.vx_code}
        if "vx" not in self.paths:
            return self.records.get(rid) or {"ok": False, "error": "not run"}
        if self._will_run(rid, args):
            shutil.rmtree(out, ignore_errors=True)
        return self.measure(rid, "vitexport", args)

    def peer(self, path: str, case: str, n: int, fp32: tuple[str, str] | None, calib: tuple[str, str]) -> dict | None:
        rid = f"{path}|{case}|{n}"
        if path not in self.paths:
            return self.records.get(rid)
        if fp32 is None:
            return self._skip(rid, "not run: vitexport wrote no model.fp32.onnx to give it")
        out = self.work / case / f"{path}-{n}"
        if path == "plain":
            args = {"model": case, "fp32": fp32[0], "fp32_digest": fp32[1], "calib": calib[0], "calib_digest": calib[1],
                    "out": str(out), "method": "minmax", "num_samples": n, "weights": None, "heldout": None}
            return self.measure(rid, "plain", args, keep_failed=True)
        if not self.peers_python.is_file():
            shown = self.peers_python.relative_to(REPO) if self.peers_python.is_relative_to(REPO) else self.peers_python
            return self._skip(rid, f"peers venv missing ({shown}): run `make bench-peers`")
        task, extra = PEER_TASKS[path]
        args = {"fp32": fp32[0], "fp32_digest": fp32[1], "calib": calib[0], "calib_digest": calib[1],
                "out": str(out / "model.int8.onnx"), "env": self.peers_env(), **extra}
        return self.measure(rid, task, args, python=str(self.peers_python), module="bench.peers", keep_failed=True)

    def peers_env(self) -> str:
        """Which install of the peers' venv ran a record: a failure recorded before a (re)install of
        ``make bench-peers`` must not stand after it. The stamp is the Makefile's ``.installed``."""
        stamp = self.peers_python.parent.parent / ".installed"
        return f"installed {stamp.stat().st_mtime_ns}" if stamp.is_file() else "no successful install"

    def score(self, rid: str, prep: dict, onnx: str | None) -> None:
        if onnx and Path(onnx).is_file():
            self.measure(f"q|{rid}", "quality", {"onnx": onnx, "digest": file_digest(onnx), "heldout": prep["score"],
                                                 "reference": prep["reference"], "qdq_as_float": True, "kind": prep["kind"]})

    # --- a case ------------------------------------------------------------------------------------
    def run_case(self, case: str) -> None:
        """Prepare, then every tool at the headline size, scores, latency, and the extra cells."""
        plan: CasePlan = self.plan
        prep_rec = self.prepare_case(case)
        if not prep_rec.get("ok"):
            return
        prep = prep_rec["data"]
        head = [] if self.extra_only else [(p, plan.num_samples) for p in plan.paths_of(case)]
        cells = head + list(plan.extra.get(case, ()))
        files: dict[str, str] = {}
        for n in sorted({n for _, n in cells}):
            calib = self.calib_file(case, prep, n)
            paths = [p for p, m in cells if m == n]
            fp32 = None
            if "vx" in paths or any(p != "vx" for p in paths):
                rec = self.vx(case, prep, n, calib) if "vx" in paths else self.records.get(f"vx|{case}|{n}", {})
                f = (rec.get("data") or {}).get("files", {}).get("model.fp32.onnx")
                if not (f and Path(f).is_file()) and n != plan.num_samples:
                    # an extra cell without its own vitexport run: the headline's FP32 file
                    f = files.get("fp32")
                if f and Path(f).is_file():
                    fp32 = (f, file_digest(f))
                self.score(f"vx|{case}|{n}", prep, (rec.get("data") or {}).get("files", {}).get("model.int8.onnx"))
                if n == plan.num_samples:
                    if fp32:
                        files["fp32"] = fp32[0]
                        self.score(f"fp32|{case}", prep, fp32[0])
                    int8 = (rec.get("data") or {}).get("files", {}).get("model.int8.onnx")
                    if int8 and Path(int8).is_file():
                        files["vx"] = int8
            for p in paths:
                if p == "vx":
                    continue
                rec = self.peer(p, case, n, fp32, calib) or {}
                int8 = (rec.get("data") or {}).get("files", {}).get("model.int8.onnx")
                self.score(f"{p}|{case}|{n}", prep, int8)
                if n == plan.num_samples and int8 and Path(int8).is_file():
                    files[p] = int8
        if self.latency and files:
            models = dict(sorted(files.items()))
            self.measure(f"lat|{case}", "latency", {"models": models, "digests": {k: file_digest(v) for k, v in models.items()},
                                                    "runs": plan.runs(case), "warmup": plan.warmup, "threads": 2,
                                                    "feeds": prep["score"]})
