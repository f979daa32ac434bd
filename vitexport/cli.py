"""The ``vitexport`` command: parse arguments, call :mod:`vitexport.api`, print, return an exit code.

Exit codes: 0 every stage passed; 1 a parity gate failed (stage and metric named; its artifacts are
moved into ``OUT/rejected/`` and the last line, ``REJECTED: ...``, says they must not ship); 2 bad input
(usage, recipe, data, model, an exception from the user's model code, not enough memory); 3 an
internal error (its traceback in ``OUT/error.log``). Every error is one line on stderr; ``-v``
adds the traceback. Warnings are one line each too; other libraries' warnings and log records stay
off the terminal (`-v` included).
"""
from __future__ import annotations

import argparse
import contextlib
import logging
import signal
import sys
import threading
import traceback
import warnings
from typing import Iterator, Sequence

from .errors import BadInput, InternalError, VitexportError, VitexportWarning, classify, one_line
from .recipe import StageName, Task

__all__ = ["main", "build_parser"]

TASKS = [t.value for t in Task]


# Help text names the default target by this mark: the registry that holds it loads torch-free but
# heavy modules (onnx-ir: ~1-4 s), which only a subcommand's --help pays for, when it prints.
_DEFAULT_TARGET_MARK = "{DEFAULT_TARGET}"


class _Parser(argparse.ArgumentParser):
    """argparse exits with 2 on usage errors already; keep its message to one line."""

    def error(self, message: str):  # noqa: D401
        self.exit(2, f"vitexport: error: {message}\n")

    def format_help(self) -> str:
        if any(_DEFAULT_TARGET_MARK in (a.help or "") for a in self._actions):
            from .targets import DEFAULT_TARGET  # lazy, see above

            for a in self._actions:  # before argparse wraps the lines
                a.help = a.help and a.help.replace(_DEFAULT_TARGET_MARK, DEFAULT_TARGET)
        return super().format_help()


# The subcommands import vitexport.api when they run, not with this module: it loads torch, ONNX
# Runtime and onnx-ir (measured: `vitexport --help` 1.2-1.4 s, `import vitexport.api` 17-28 s on this
# loaded 2-core machine), which --help and a usage error never need.


def cmd_export(args: argparse.Namespace) -> int:
    """Export a model for a target: passes, ONNX, simplify, INT8, engine script; parity after each stage."""
    from . import api
    from .progress import Heartbeat

    arts = api.export(
        args.model, args.target, weights=args.weights, input_shape=args.input_shape, calib=args.calib,
        parity_data=args.parity_data, out=args.out, overrides=args.set, layers=args.layers, outputs=args.outputs,
        task=args.task,
        trust_pickle=args.trust_pickle, num_classes=args.num_classes, resume=not args.no_resume,
        log=lambda line: print(line, flush=True),
        heartbeat=Heartbeat(live=sys.stdout.isatty()),  # a spinner on a terminal, a line every 10 s elsewhere
    )
    _print_summary(arts)
    return 0


def _print_summary(arts) -> None:
    run = arts.parity
    vacuous = run.extra.get("vacuous_gate")
    if vacuous:
        print(f"vitexport: warning: the parity gate is vacuous: {vacuous}", file=sys.stderr)
    for note in run.notes:
        print(f"note: {note}")
    accs = [(s.stage, s.metrics) for s in run.stages if s.metrics.accuracy is not None]
    if accs:
        ref = accs[0][1].reference_accuracy
        last = {stage: m.accuracy for stage, m in accs}
        fp32 = last.get("simplify", ref)
        int8 = last.get("quantize_int8")
        line = f"accuracy on {run.data}: torch {ref:.4f}, FP32 ONNX {fp32:.4f}"
        if int8 is not None:
            line += f", INT8 ONNX {int8:.4f}"
        print(line)
    print(f"all stages passed; artifacts in {arts.out_dir}/")
    for name in sorted(arts.files):
        print(f"  {name}")


def cmd_targets(args: argparse.Namespace) -> int:
    """List the targets (vitexport's and plug-ins'); each name is a --target with its own recipe."""
    from . import api  # lazy, see above

    for name, desc in api.targets().items():
        print(f"{name:<10} {desc}")
    return 0


def cmd_check(args: argparse.Namespace) -> int:
    """Check an ONNX file against a target: contract (ops, opset, static shapes, dtypes), the target's
    runtime rules and the lint (dead tensors, names, float64, Q/DQ that does nothing). Exit 0 when no
    error (warnings are printed); 2 when one breaks. A few violations print one line each (node or
    tensor, rule, hint); many print a summary by rule with counts, and -v lists every one."""
    from . import api  # lazy, see above

    result = api.check(args.model, args.target, overrides=args.set)
    for line in result.report(full=args.verbose):
        print(line)
    return 0 if result else 2


def cmd_parity(args: argparse.Namespace) -> int:
    """Re-render a finished run's report (OUT_DIR), or compare two models with --compare A B."""
    from . import api  # lazy, see above
    from .parity import load_run  # as vitexport.api: loaded when the command runs

    if args.compare:
        if not args.parity_data:
            raise BadInput("--compare needs --parity-data PATH")
        result = api.compare(
            args.compare[0], args.compare[1], args.parity_data, layers=args.layers, out=args.out, target=args.target,
            stage=args.stage, weights=args.weights, input_shape=args.input_shape, num_samples=args.num_samples,
        )
        print(result.summary())
        return 0 if result.passed else 1
    if not args.out_dir:
        raise BadInput("parity: give OUT_DIR (a finished run) or --compare A B")
    files = api.render_parity(args.out_dir)
    for path in files.values():
        print(path)
    return 0 if load_run(args.out_dir).passed else 1


_TARGET_HELP = f"target name (see `vitexport targets`; default: {_DEFAULT_TARGET_MARK}) or a recipe YAML path"


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="vitexport", description="PyTorch ViT → parity-checked INT8 ONNX and compiled engine artifacts.")
    p.add_argument("-v", "--verbose", action="store_true",
                   help="log each step (calibration passes, parity runs) with times; check: list every violation")
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)

    e = sub.add_parser("export", help=cmd_export.__doc__, description=cmd_export.__doc__)
    e.add_argument("--target", default=None, help=_TARGET_HELP)
    e.add_argument("--model", default=None, help="timm:NAME | torchvision:NAME | hf:DIR | python:PATH.py:FUNC (default: the bundled demo)")
    e.add_argument("--weights", default=None, help=".safetensors, or a state_dict .pt/.pth")
    e.add_argument("--input-shape", default=None, help="N,C,H,W (N,L for a text encoder); default from the model")
    e.add_argument("--num-classes", type=int, default=None,
                   help="classifier size of a timm:/torchvision:/hf: model (default: the --weights' head, else the model's)")
    e.add_argument("--outputs", default=None, metavar="NAME,...",
                   help="keep only these of the model's outputs (e.g. logits,pred_boxes); default every tensor output")
    e.add_argument("--task", default=None, choices=TASKS, metavar="TASK",
                   help=f"what the outputs mean, one of {', '.join(TASKS)}: its metrics are gated beside cosine "
                        "(mAP, mIoU, AbsRel, recall@k); default: from the model (a ...ForObjectDetection detects)")
    e.add_argument("--calib", default=None, help="calibration data: image folder or .npz")
    e.add_argument("--parity-data", default=None, help="parity data: image folder or .npz (optional labels 'y'; a "
                   "detector's boxes: 'y' [N, M] beside 'y_boxes' [N, M, 4], or a COCO json in the folder)")
    e.add_argument("--out", default=None, help="output folder (default build/<model>-<target>)")
    e.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a recipe key, e.g. calibration.method=entropy")
    e.add_argument("--layers", action="store_true", help="per-layer localisation of the INT8 error")
    e.add_argument("--trust-pickle", action="store_true", help="allow a pickle checkpoint that runs code when loaded")
    e.add_argument("--no-resume", action="store_true", help="run every stage even if an earlier run's artifacts match")
    e.set_defaults(func=cmd_export)

    t = sub.add_parser("targets", help=cmd_targets.__doc__, description=cmd_targets.__doc__)
    t.set_defaults(func=cmd_targets)

    c = sub.add_parser("check", help=cmd_check.__doc__, description=cmd_check.__doc__)
    c.add_argument("model", help="the ONNX file to check")
    c.add_argument("--target", default=None, help=_TARGET_HELP)
    c.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a recipe key, e.g. contract.max_opset=19")
    # SUPPRESS: absent here, the global -v (before `check`) stands
    c.add_argument("-v", "--verbose", action="store_true", default=argparse.SUPPRESS, help="list every violation, one line each")
    c.set_defaults(func=cmd_check)

    r = sub.add_parser("parity", help=cmd_parity.__doc__, description=cmd_parity.__doc__)
    r.add_argument("out_dir", nargs="?", default=None, help="a finished run's output folder")
    r.add_argument("--compare", nargs=2, metavar=("A", "B"), help="two ONNX files, or a model URI and an ONNX file")
    r.add_argument("--parity-data", default=None, help="inputs for --compare (image folder or .npz)")
    r.add_argument("--layers", action="store_true", help="per-layer comparison and first divergence")
    r.add_argument("--out", default=None, help="where --compare writes its report")
    r.add_argument("--target", default=None,
                   help=f"target (or recipe YAML path) whose tolerances apply (default: {_DEFAULT_TARGET_MARK})")
    r.add_argument("--stage", default=StageName.simplify.value, metavar="STAGE",
                   help=f"stage whose tolerance applies: {', '.join(StageName)} or one the target adds (default: %(default)s; "
                        "quantize_int8 for an INT8 model)")
    r.add_argument("--weights", default=None, help="weights for a model URI given to --compare")
    r.add_argument("--input-shape", default=None, help="N,C,H,W for a model URI given to --compare")
    r.add_argument("--num-samples", type=int, default=None, help="compare on at most this many samples (default: all)")
    r.set_defaults(func=cmd_parity)
    return p


@contextlib.contextmanager
def _verbose_log(verbose: bool) -> Iterator[None]:
    """``-v``: the package's log on stderr for this call (removed after, so that ``main`` called
    again in one process neither doubles the lines nor writes to a stream that has gone).

    Other libraries' log records stop at a handler that drops them, with or without ``-v``: with no
    handler anywhere, Python's last-resort handler prints WARNING records on stderr (onnx-ir's
    shape inference logs a failure with its traceback, twice per ``vitexport check`` of an Orin
    INT8 file against rk3588's recipe)."""
    root = logging.getLogger()
    quiet = logging.NullHandler()
    root.addHandler(quiet)
    try:
        with _package_log(verbose):
            yield
    finally:
        root.removeHandler(quiet)


@contextlib.contextmanager
def _package_log(verbose: bool) -> Iterator[None]:
    if not verbose:
        yield
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(name)s: %(message)s", "%H:%M:%S"))
    pkg = logging.getLogger("vitexport")
    level = pkg.level
    pkg.addHandler(handler)
    pkg.setLevel(logging.DEBUG)
    try:
        yield
    finally:
        pkg.removeHandler(handler)
        pkg.setLevel(level)


@contextlib.contextmanager
def _one_line_warnings() -> Iterator[None]:
    """Print each of vitexport's warnings as ``vitexport: warning: ...`` on one line, never with a line
    of source. Other libraries' warnings (torch's FutureWarnings, numpy's overflow in a cast) say
    nothing the user can act on: dropped, ``-v`` or not, unless Python's own ``-W`` /
    ``PYTHONWARNINGS`` asks for them."""

    def show(message, category, filename, lineno, file=None, line=None):
        ours = issubclass(category, VitexportWarning)
        if ours or sys.warnoptions:
            text = one_line(str(message), 400)
            text = f"vitexport: warning: {text if ours else f'{category.__name__}: {text}'}"
            if ours and sys.stderr.isatty():
                from rich.console import Console  # yellow on a terminal (rich honours NO_COLOR), plain elsewhere

                Console(stderr=True, highlight=False, soft_wrap=True).print(text, style="yellow", markup=False)
            else:
                print(text, file=sys.stderr)

    saved = warnings.showwarning
    warnings.showwarning = show
    try:
        yield
    finally:
        warnings.showwarning = saved


def _fail(exc: BaseException, verbose: bool) -> int:
    """Print what went wrong as one line (and the traceback with ``-v``); return the exit code."""
    err = classify(exc)
    if err is None:
        print("vitexport: interrupted", file=sys.stderr)
        return 130
    msg = str(err)
    if isinstance(err, InternalError):
        log = getattr(err, "log_path", None)
        msg += f"; traceback in {log}" if log else ("" if verbose else "; run with -v for the traceback")
    cause = exc if err is not exc else err.__cause__
    if verbose and cause is not None and not (isinstance(cause, VitexportError) and cause is err):
        traceback.print_exception(cause, file=sys.stderr)
    sys.stdout.flush()  # the stage lines before the error, whatever buffering a pipe gives stdout
    print(f"vitexport: error: {msg}", file=sys.stderr, flush=True)
    if getattr(err, "verdict", ""):  # a failed gate: the last line (stdout: the error stays one line) names what must not ship
        print(err.verdict, flush=True)
    return err.exit_code


@contextlib.contextmanager
def _terminate_as_interrupt() -> Iterator[None]:
    """SIGTERM (``timeout``, a CI runner, ``kill``) raises KeyboardInterrupt as Ctrl-C does, so the cleanup of
    a run happens on both: a compiler worker is killed, not orphaned, and the exit is 130 ("interrupted").
    Python's own SIGTERM action ends the process with no cleanup at all. Main thread only (signal's rule)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum, frame):
        raise KeyboardInterrupt(f"signal {signum}")

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)

    with _verbose_log(args.verbose), _one_line_warnings(), _terminate_as_interrupt():
        try:
            return args.func(args)
        except BaseException as exc:  # the one error boundary: every failure becomes an exit code
            return _fail(exc, args.verbose)


if __name__ == "__main__":
    sys.exit(main())
