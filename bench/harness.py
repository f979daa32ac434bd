"""The bench's walker: one child process per measurement, records kept as they come (:class:`Bench`).

:mod:`bench.run` (the command line) and :mod:`bench.casebench` (the peers plan) both build on it.
"""
from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

import psutil

from .models import MODELS
from .plan import GridCell, Plan
from .proc import GB, REPO, ChildResult, run_child

__all__ = ["Bench", "default_cap_gb", "link_tree"]


def default_cap_gb() -> float:
    """18 GB as the issue asks, but never more than 65 % of what is available now: on a shared
    machine the rest belongs to others, and the kernel's OOM killer would pick a victim at random."""
    return round(min(18.0, 0.65 * psutil.virtual_memory().available / GB), 1)


class Bench:
    """Walks a :class:`~bench.plan.Plan`, one child process per measurement, keeping records."""

    def __init__(self, plan: Plan, work: Path, cap_gb: float, resume: bool, log=print):
        self.plan, self.work, self.cap = plan, work, int(cap_gb * GB)
        self.cap_gb = cap_gb
        self.log = log
        self.path = work / f"records-{plan.name}.json"
        self.records: dict[str, dict] = {}
        if resume and self.path.is_file():
            self.records = json.loads(self.path.read_text())
        self.started = time.time()
        self.vx_overrides: tuple[str, ...] = ()  # legacy plan: extra recipe overrides for every vitexport run

    # --- records ---------------------------------------------------------------------------------
    def _save(self) -> None:
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.records, indent=1))
        os.replace(tmp, self.path)

    def measure(self, rid: str, task: str, args: dict, *, python: str | None = None, module: str = "bench.worker",
                keep_failed: bool = False) -> dict:
        """Run a task in a child unless ``rid`` has a good record of the same arguments; store and return it.

        ``keep_failed``: a failed record of the same arguments is a result too (a peer that cannot
        quantize a model fails the same way next time), unless the memory cap or the clock killed it.
        ``python`` / ``module``: another interpreter and worker (the peers' venv, ``bench.peers``).
        """
        old = self.records.get(rid)
        if old is not None and old.get("args") == args and (
                old.get("ok") or (keep_failed and not old.get("exceeded_cap") and "timed out" not in (old.get("error") or ""))):
            return old
        t = time.strftime("%H:%M:%S")
        self.log(f"[{t}] {rid} ...")
        log_path = self.work / "logs" / (rid.replace("|", "_") + ".log")
        load = os.getloadavg()  # a shared machine: what else ran shows in the timings
        res: ChildResult = run_child(task, args, cap_bytes=self.cap, timeout_s=self.plan.timeout_s, log_path=log_path,
                                     python=python, module=module)
        rec = res.to_dict()
        rec["started"], rec["load_before"], rec["load_after"] = t, list(load), list(os.getloadavg())
        rec["args"] = args
        rec["log"] = str(log_path.relative_to(REPO)) if log_path.is_relative_to(REPO) else str(log_path)
        self.records[rid] = rec
        self._save()
        status = "ok" if res.ok else f"FAILED: {res.error}"
        self.log(f"    {res.wall_s:.1f} s, peak {res.peak_bytes / GB:.2f} GB, load {load[0]:.1f} → {os.getloadavg()[0]:.1f}, {status}")
        return rec

    # --- steps -----------------------------------------------------------------------------------
    def prepare(self, model: str) -> dict:
        args = {"model": model, "work": str(self.work / model), "max_calib": self.plan.max_calib}
        if self.plan.heldout:
            args["heldout"] = self.plan.heldout
        return self.measure(f"prepare|{model}", "prepare", args)

    def _will_run(self, rid: str, args: dict) -> bool:
        rec = self.records.get(rid)
        return not (rec and rec.get("ok") and rec.get("args") == args)

    def vitexport(self, model: str, prep: dict, method: str, n: int, target: str = "orin", base: Path | None = None) -> dict:
        """One vitexport run.

        A failing INT8 parity gate does not stop the bench: the worker records it as the gate's
        verdict and the INT8 model is measured like the plain path's. ``base``: a finished run whose
        export stages are reused (hard links), for the extra ``cpu`` recipe run.
        """
        out = self.work / model / f"vx-{target}-{method}-{n}"
        rid = f"vx|{model}|{target}|{method}|{n}"
        args = {"uri": prep["uri"], "weights": prep["weights"], "calib": prep["calib"], "heldout": prep["heldout"],
                "out": str(out), "target": target, "method": method, "num_samples": n, "resume": base is not None}
        if self.vx_overrides:
            args["overrides"] = list(self.vx_overrides)
        if self._will_run(rid, args):
            shutil.rmtree(out, ignore_errors=True)  # a fresh run: nothing of an earlier one is reused
            if base is not None:
                link_tree(base, out, ("model.raw.onnx", "model.fp32.onnx", ".vitexport-state.json"))
        return self.measure(rid, "vitexport", args)

    def plain(self, model: str, prep: dict, method: str, n: int) -> dict:
        """One plain-path run: export, then ``quantize_static``."""
        out = self.work / model / f"plain-{method}-{n}"
        rid = f"plain|{model}|{method}|{n}"
        args = {"model": model, "weights": prep["weights"], "calib": prep["calib"], "heldout": prep["heldout"],
                "out": str(out), "method": method, "num_samples": n}
        if self._will_run(rid, args):
            shutil.rmtree(out, ignore_errors=True)
        return self.measure(rid, "plain", args)

    def quality(self, rid: str, prep: dict, onnx: str | None) -> None:
        """INT8 quality of one ONNX file against the torch FP32 logits, stored under ``q|rid``."""
        if onnx and Path(onnx).is_file():
            self.measure(f"q|{rid}", "quality", {"onnx": onnx, "heldout": prep["heldout"], "reference": prep["reference"]})

    def run_model(self, model: str) -> None:
        """Headline runs of both paths, their quality, one interleaved latency run, the grid."""
        plan = self.plan
        prep_rec = self.prepare(model)
        if not prep_rec["ok"]:
            return
        prep = prep_rec["data"]
        n_head = plan.num_samples
        base: Path | None = None
        onnx: dict[str, str] = {}  # latency label -> file

        def have(rec: dict, name: str) -> str | None:
            f = rec.get("data", {}).get("files", {}).get(name)
            return f if f and Path(f).is_file() else None

        for method in plan.methods:
            vx = self.vitexport(model, prep, method, n_head)
            self.quality(f"vx|{model}|orin|{method}|{n_head}", prep, have(vx, "model.int8.onnx"))
            if have(vx, "model.int8.onnx"):
                onnx[f"vx|orin|{method}"] = have(vx, "model.int8.onnx")
            if "vx|fp32" not in onnx and have(vx, "model.fp32.onnx"):
                onnx["vx|fp32"] = have(vx, "model.fp32.onnx")
                base = Path(onnx["vx|fp32"]).parent
            pl = self.plain(model, prep, method, n_head)
            self.quality(f"plain|{model}|{method}|{n_head}", prep, have(pl, "model.int8.onnx"))
            if have(pl, "model.int8.onnx"):
                onnx[f"plain|{method}"] = have(pl, "model.int8.onnx")
            if "plain|fp32" not in onnx and have(pl, "model.fp32.onnx"):
                onnx["plain|fp32"] = have(pl, "model.fp32.onnx")
        if plan.cpu_target and not MODELS[model].is_demo and base is not None:
            # vitexport's cpu recipe: the same export (reused from the orin run), quantized the way
            # ONNX Runtime on x86 runs fastest; measured for latency and quality only.
            method = "percentile" if "percentile" in plan.methods else plan.methods[0]
            vx = self.vitexport(model, prep, method, n_head, target="cpu", base=base)
            self.quality(f"vx|{model}|cpu|{method}|{n_head}", prep, have(vx, "model.int8.onnx"))
            if have(vx, "model.int8.onnx"):
                onnx[f"vx|cpu|{method}"] = have(vx, "model.int8.onnx")
        if onnx:
            self.measure(f"lat|{model}", "latency", {"models": dict(sorted(onnx.items())), "runs": plan.runs(model),
                                                     "warmup": plan.warmup, "threads": 2})
        exceeded: set[tuple[str, str]] = set()
        for cell in plan.grid.get(model, ()):
            self.grid_cell(model, prep, cell, exceeded)

    def grid_cell(self, model: str, prep: dict, cell: GridCell, exceeded: set) -> None:
        """One calibration-memory cell; skipped (and recorded as such) when implied or already run."""
        if cell.num_samples == self.plan.num_samples and cell.method in self.plan.methods:
            return  # the headline already measured it
        key = (cell.path, cell.method)
        if cell.path == "plain":
            rid = f"plain|{model}|{cell.method}|{cell.num_samples}"
            if key in exceeded:
                self.records[rid] = {"ok": False, "skipped": True, "exceeded_cap": True, "cap_bytes": self.cap,
                                     "error": f"not run: fewer samples already exceeded {self.cap_gb:.1f} GB"}
                self._save()
                return
            rec = self.plain(model, prep, cell.method, cell.num_samples)
        else:
            rec = self.vitexport(model, prep, cell.method, cell.num_samples)
        if rec.get("exceeded_cap"):
            exceeded.add(key)
        # Grid outputs are large (ViT-B: 2 × 330 MB per cell) and measured for memory only.
        out = self.work / model / (f"vx-orin-{cell.method}-{cell.num_samples}" if cell.path == "vx" else f"plain-{cell.method}-{cell.num_samples}")
        shutil.rmtree(out, ignore_errors=True)


def link_tree(src: Path, dst: Path, names: tuple[str, ...]) -> None:
    """Hard-link a finished run's files into a new folder (vitexport writes atomically, so sharing is safe)."""
    dst.mkdir(parents=True, exist_ok=True)
    for name in names:
        s = src / name
        if s.is_file():
            try:
                os.link(s, dst / name)
            except OSError:
                shutil.copy2(s, dst / name)
