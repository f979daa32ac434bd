"""The Ethos-U worker: run by ``.venv-ethos``'s interpreter (``make setup-ethos``), never imported by vitexport.

ExecuTorch's Arm backend, Vela and the TOSA reference model pin numpy<2.2, flatbuffers 25.2 and an
ExecuTorch build, so they live in a venv of their own and run here, in a process of their own, with
files in and files out::

    python -I vitexport/targets/ethos_u/worker.py REQUEST.json

Route ``tflite`` (:mod:`tflite_worker`, beside this file): the lowered program written as a float ``.tflite``,
LiteRT's quantizer (16x8), the LiteRT interpreter on the parity inputs, Vela. Route ``executorch``: one request quantizes the torch program vitexport's passes left (``torch.export``-ed by the client to a
``.pt2``; torch is the project's own pin, shared into the venv) with ExecuTorch's ``EthosUQuantizer`` on
vitexport's calibration samples, lowers it with ``EthosUPartitioner`` (TOSA, then Vela) into a ``.pte``,
runs Vela once more on each partition's TOSA for its summary CSV (cycles, latency, SRAM / flash), and
runs the INT8 program on the parity inputs with every delegate computed by the TOSA reference model
(the CPU ops between delegates by ExecuTorch's own ops). The reply names the step running when it
stopped (written after every step, atomically, so a crash leaves the steps that finished). Only the
standard library, numpy, torch and the Arm toolchain are imported here; the schema is in
:mod:`vitexport.targets.ethos_u.client`.
"""
from __future__ import annotations

import csv
import glob
import json
import os
import sys
import time
import traceback

import numpy as np

__all__ = ["main", "run_request", "calibrated_mask_fill"]

#: a constant at or below this is a mask's "minus infinity" (-1e9, finfo.min), not data
_MASK_FLOOR = -1e4
#: masked logits get the smallest unmasked logit seen in calibration minus this: exp(-12) ≈ 6e-6 of the
#: least weight a real token gets, while the int8 range of the softmax input grows by 12 instead of 1e9
_MASK_MARGIN = 12.0
#: the smallest int16 activation scale the observers may pick. ExecuTorch's a16w8 default (2**-12) is a
#: floor that makes every tensor span at least ±8: a LayerNorm's variance (0.0014 for the demo's CLS token
#: in block 0, range 0.17) then lands in the first of the 256 segments of the int16 TOSA TABLE that computes
#: rsqrt, whose linear interpolation from rsqrt(0) returned 953 for 26.7 (reference-model cosine 0.64 on a
#: LayerNorm alone, 0.19 on the demo); 2**-24 leaves the observers' own range in charge
_INT16_MIN_SCALE = 2.0 ** -24
#: ops that carry data between delegates without arithmetic (placement is reported, not gated)
_MOVES = ("quantize_per", "dequantize_per", "getitem", "view", "reshape", "permute", "transpose", "clone",
          "expand", "squeeze", "unsqueeze", "cat", "slice", "select", "_to_copy", "alias")


def _save(req: dict, reply: dict) -> None:
    tmp = req["reply"] + ".tmp"
    with open(tmp, "w") as f:
        json.dump(reply, f, indent=1)
    os.replace(tmp, req["reply"])


def _rows(rows: list[list[str]]):
    import torch

    return [tuple(torch.from_numpy(np.load(p)) for p in row) for row in rows]


def _attr(gm, target: str):
    """The constant a ``get_attr`` node names (``blocks.3.attn.mask``: nested in a submodule)."""
    owner, _, name = target.rpartition(".")
    return getattr(gm.get_submodule(owner) if owner else gm, name)


def _mask_sites(gm) -> list[tuple]:
    """(node, operand index of the mask, the data operand) for each add / where whose constant holds a
    mask's minus infinity."""
    import torch

    sites = []
    for node in gm.graph.nodes:
        if node.op != "call_function" or node.target not in (torch.ops.aten.add.Tensor, torch.ops.aten.where.self,
                                                             torch.ops.aten.where.ScalarOther):
            continue
        for i, arg in enumerate(node.args):
            if node.target is not torch.ops.aten.add.Tensor and i == 0:
                continue  # where's condition
            const = _attr(gm, arg.target) if getattr(arg, "op", None) == "get_attr" else arg
            low = float(const.detach().min()) if isinstance(const, torch.Tensor) and const.is_floating_point() and const.numel() \
                else (float(const) if isinstance(const, (int, float)) else 0.0)
            if low <= _MASK_FLOOR:
                data = node.args[1 - i] if node.target is torch.ops.aten.add.Tensor else node.args[3 - i]
                sites.append((node, i, data))
    return sites


def calibrated_mask_fill(gm, samples) -> list[dict]:
    """Replace each mask's minus infinity (-1e9, ``finfo.min``) by the smallest unmasked logit seen on
    ``samples`` minus :data:`_MASK_MARGIN`: a quantizer calibrates the softmax input's range from every
    value it sees, and a -1e9 in that range leaves no int8 step for the real logits.

    Returns:
        One record per site: the node and the fill written.
    """
    import torch

    sites = _mask_sites(gm)
    if not sites:
        return []
    lows: dict = {}
    conds = {node.args[0]: None for node, _, _ in sites if node.target is not torch.ops.aten.add.Tensor
             and _is_constant(node.args[0])}

    class Watch(torch.fx.Interpreter):
        def run_node(self, n):
            out = super().run_node(n)
            if any(n is d for _, _, d in sites) and isinstance(out, torch.Tensor):
                lows[n] = min(lows.get(n, float("inf")), float(out.min()))
            if n in conds:
                conds[n] = out
            return out

    with torch.no_grad():
        for args in samples:
            Watch(gm).run(*args)
    done = []
    for node, i, data in sites:
        fill = lows.get(data, -30.0) - _MASK_MARGIN
        arg = node.args[i]
        if getattr(arg, "op", None) == "get_attr":
            const = _attr(gm, arg.target)
            owner, _, name = arg.target.rpartition(".")
            setattr(gm.get_submodule(owner) if owner else gm, name,
                    torch.where(const <= _MASK_FLOOR, torch.full_like(const, fill), const))
        else:
            node.args = tuple(fill if j == i else a for j, a in enumerate(node.args))
        done.append({"node": node.name, "fill": round(fill, 3)})
        if conds.get(node.args[0]) is not None:
            _where_as_arithmetic(gm, node, conds[node.args[0]], fill)
            done[-1]["where"] = "x * keep + fill * (1 - keep)"
    gm.graph.eliminate_dead_code()
    gm.recompile()
    return done


def _is_constant(node) -> bool:
    """Whether ``node`` depends on no input of the program (a mask built from buffers)."""
    return getattr(node, "op", None) == "get_attr" or (
        getattr(node, "op", None) == "call_function" and all(_is_constant(a) for a in node.all_input_nodes))


def _where_as_arithmetic(gm, node, keep, fill: float) -> None:
    """``where(keep, x, fill)`` with a constant ``keep`` → ``x * keep + fill * (1 - keep)``, the same numbers:
    ExecuTorch's partitioner takes a where only when both values come from int tensors or dequantize nodes,
    so vitexport's ``mask_to_where`` (a scalar fill) left each block's masked softmax on the CPU and cut the
    demo into 5 NPU partitions; a multiply and an add by constants run on the NPU."""
    import torch

    keep = keep.to(torch.float32)
    name = node.name
    gm.register_buffer(f"{name}_keep", keep)
    gm.register_buffer(f"{name}_fill", (1.0 - keep) * fill)
    with gm.graph.inserting_before(node):
        k, b = gm.graph.get_attr(f"{name}_keep"), gm.graph.get_attr(f"{name}_fill")
        kept = gm.graph.call_function(torch.ops.aten.mul.Tensor, (node.args[1], k))
        out = gm.graph.call_function(torch.ops.aten.add.Tensor, (kept, b))
    out.meta = dict(node.meta)
    node.replace_all_uses_with(out)
    gm.graph.erase_node(node)


def _quantize(req: dict, st: dict, reply: dict) -> None:
    """pt2e: the Arm quantizer annotates, vitexport's calibration samples measure, convert writes Q/DQ."""
    import torch
    from executorch.backends.arm.ethosu import EthosUCompileSpec
    from executorch.backends.arm.quantizer import (EthosUQuantizer, get_symmetric_a16w8_quantization_config,
                                                   get_symmetric_quantization_config)
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    ep = torch.export.load(req["program"])
    gm = ep.module(check_guards=False)  # a guard check is a call_module the Arm passes cannot trace
    calib = _rows(req["calibration"])
    reply["mask_fill"] = calibrated_mask_fill(gm, calib[:8])
    os.makedirs(req["work_dir"], exist_ok=True)
    spec = EthosUCompileSpec(req["accelerator"], system_config=req.get("system_config"),
                             memory_mode=req.get("memory_mode"))
    spec.dump_intermediate_artifacts_to(req["work_dir"])  # the partitions' TOSA, read by the reference step
    quantizer = EthosUQuantizer(spec)
    # int16 activations with int8 weights (Ethos-U's 16x8 kernels): LayerNorm, softmax and GELU keep their
    # resolution, at twice the feature-map bytes
    per_channel = req.get("per_channel", True)
    if req.get("activations", "int16") == "int16":
        config = get_symmetric_a16w8_quantization_config(is_per_channel=per_channel,
                                                        epsilon=_INT16_MIN_SCALE)
    else:
        config = get_symmetric_quantization_config(is_per_channel=per_channel)
    quantizer.set_global(config)
    if req.get("activations", "int16") == "int16" and "u55" in req["accelerator"]:
        # Ethos-U55 multiplies two activations (attention's matmuls) in int8 only: int16 leaves them on the CPU
        for op in (torch.ops.aten.bmm.default, torch.ops.aten.matmul.default, torch.ops.aten.mm.default):
            quantizer.set_node_target(op, get_symmetric_quantization_config(is_per_channel=per_channel))
        reply["int8_ops"] = ["bmm", "matmul", "mm"]
    reply["activations"] = req.get("activations", "int16")
    prepared = prepare_pt2e(gm, quantizer)
    names = req["input_names"]  # the program takes the model's inputs by name, as vitexport calls it
    with torch.no_grad():
        for args in calib:
            prepared(**dict(zip(names, args)))
    st["spec"], st["quantized"], st["example"] = spec, convert_pt2e(prepared), dict(zip(names, calib[0]))


def _record(path: str, outs: list[list[np.ndarray]]) -> list[str]:
    """Output j of every sample stacked into ``path/output_j.npy``."""
    os.makedirs(path, exist_ok=True)
    files = []
    for j, arrs in enumerate(outs):
        files.append(os.path.join(path, f"output_{j}.npy"))
        np.save(files[-1], np.concatenate(arrs, axis=0))
    return files


def _stack(outs: list[list[np.ndarray]], got) -> None:
    """Append one sample's outputs (a tensor or a tuple of them) to ``outs``, one list per output."""
    got = got if isinstance(got, (tuple, list)) else (got,)
    for j, o in enumerate(got):
        if len(outs) <= j:
            outs.append([])
        outs[j].append(o.detach().float().numpy())


def _quantized_outputs(req: dict, st: dict, reply: dict) -> None:
    """The quantized program in torch (Q/DQ as float ops) on the parity inputs: what the quantizer wrote."""
    import torch

    outs: list[list[np.ndarray]] = []
    with torch.no_grad():
        for args in _rows(req["inputs"]):
            _stack(outs, st["quantized"](**dict(zip(req["input_names"], args))))
    reply["quantized_outputs"] = _record(os.path.join(req["outputs_dir"], "quantized"), outs)


def _lower(req: dict, st: dict, reply: dict) -> None:
    """TOSA → Vela for every partition the Arm partitioner takes; the ``.pte`` written."""
    import torch
    from executorch.backends.arm.ethosu import EthosUPartitioner
    from executorch.exir import to_edge_transform_and_lower

    program = torch.export.export(st["quantized"], (), kwargs=st["example"])
    edge = to_edge_transform_and_lower(program, partitioner=[EthosUPartitioner(st["spec"])])
    st["manager"], st["edge"] = edge, edge.exported_program()
    flags = dict(f[2:].split("=", 1) for f in st["spec"].compiler_flags if f.startswith("--") and "=" in f)
    reply["system_config"], reply["memory_mode"] = flags.get("system-config"), flags.get("memory-mode")


def _tosa_files(work: str) -> list[str]:
    """The partitions' TOSA files in partition order (``output_tag<N>_<spec>.tosa``)."""
    files = glob.glob(os.path.join(work, "output_tag*.tosa"))
    return sorted(files, key=lambda p: int(os.path.basename(p)[len("output_tag"):].split("_")[0]))


def _vela(req: dict, st: dict, reply: dict) -> None:
    """Vela once more on each partition's TOSA (the same flags as the lowering) for its summary CSV."""
    from ethosu.vela import vela

    flags = [f for f in st["spec"].compiler_flags if not f.startswith(("--output-format", "--output-dir"))]
    reply["partitions"] = []
    for i, tosa in enumerate(_tosa_files(req["work_dir"])):
        out = os.path.join(req["work_dir"], f"vela{i}")
        vela.main([*flags, f"--output-dir={out}", tosa])
        summary = glob.glob(os.path.join(out, "*_summary_*.csv"))
        with open(summary[0]) as f:
            reply["partitions"].append({"tosa": tosa, **next(csv.DictReader(f))})


def _macs(node) -> int:
    """Multiply-accumulates of a linear / conv / matmul op from its traced shapes (0 for other ops)."""
    name = str(node.target)
    val = node.meta.get("val")
    if val is None or not any(k in name for k in ("linear", "convolution", "mm", "matmul")):
        return 0
    out = int(np.prod(val.shape))
    w = node.args[1].meta.get("val") if len(node.args) > 1 and hasattr(node.args[1], "meta") else None
    if w is None:
        return 0
    if "convolution" in name:
        return out * int(np.prod(w.shape[1:]))
    return out * int(w.shape[-1] if "linear" in name else w.shape[-2])


def _placement(st: dict, reply: dict) -> None:
    """Which ops stay on the CPU (outside every delegate), with their multiply-accumulates."""
    cpu = []
    for node in st["edge"].graph_module.graph.nodes:
        if node.op != "call_function" or "executorch_call_delegate" in str(node.target):
            continue
        name = str(getattr(node.target, "__name__", node.target))
        cpu.append({"node": node.name, "op": name, "macs": _macs(node),
                    "moves": any(m in name for m in _MOVES)})
    reply["cpu_ops"] = cpu
    reply["delegates"] = sum(1 for n in st["edge"].graph_module.graph.nodes
                             if "executorch_call_delegate" in str(getattr(n, "target", "")))


def _tosa_inputs(buf: bytes) -> tuple[list[str], list[tuple[int, ...]]]:
    """A TOSA file's input names and shapes (its main block's)."""
    from tosa import TosaGraph

    blk = TosaGraph.TosaGraph.GetRootAs(buf, 0).Regions(0).Blocks(0)
    shapes = {}
    for i in range(blk.TensorsLength()):
        t = blk.Tensors(i)
        shapes[t.Name().decode()] = tuple(int(d) for d in t.ShapeAsNumpy()) if t.ShapeLength() else ()
    names = [blk.Inputs(i).decode() for i in range(blk.InputsLength())]
    return names, [shapes.get(n, ()) for n in names]


def _delegate_graphs(ep, files: list[str]) -> dict[str, tuple[bytes, list[int]]]:
    """Each delegate call's TOSA (by the call node's name) and which of its arguments feeds each TOSA input.

    ExecuTorch numbers the files by partition tag, not in the order the program calls them (Ethos-U55 cuts a
    ViT block into 3 partitions and calls tag 2 first); a partition's inputs are named after the nodes that
    feed it, so a call is matched on its arguments' names, else on their shapes in order.
    """
    table = []
    for path in files:
        with open(path, "rb") as f:
            buf = f.read()
        table.append((path, buf, *_tosa_inputs(buf)))
    found: dict[str, tuple[bytes, list[int]]] = {}
    for node in ep.graph_module.graph.nodes:
        if "executorch_call_delegate" not in str(node.target):
            continue
        names = [a.name for a in node.args[1:]]
        shapes = [tuple(int(d) for d in a.meta["val"].shape) for a in node.args[1:]]
        pick = [t for t in table if sorted(t[2]) == sorted(names)] or [t for t in table if t[3] == shapes]
        if len(pick) != 1:
            raise RuntimeError(f"delegate {node.name} (inputs {names}, shapes {shapes}) matches {len(pick)} of the "
                               f"partitions' TOSA files {[os.path.basename(t[0]) for t in table]}")
        path, buf, tosa_names, _ = pick[0]
        table.remove(pick[0])
        found[node.name] = (buf, [names.index(n) for n in tosa_names] if sorted(tosa_names) == sorted(names)
                            else list(range(len(names))))
    return found


def _reference(req: dict, st: dict, reply: dict) -> None:
    """The quantized program on the parity inputs: delegates on the TOSA reference model, the rest in torch."""
    import torch
    import tosa_reference_model as ref

    ep = st["edge"]
    graphs = _delegate_graphs(ep, _tosa_files(req["work_dir"]))
    consts = {**ep.state_dict, **ep.constants}
    sig = ep.graph_signature

    class Run(torch.fx.Interpreter):
        def run_node(self, n):
            if n.name not in graphs:
                return super().run_node(n)
            buf, order = graphs[n.name]
            args = self.fetch_args_kwargs_from_env(n)[0][1:]
            outs, status = ref.run(buf, [args[i].detach().contiguous().numpy() for i in order],
                                   initialize_variable_tensor_from_numpy=True)
            if status != ref.GraphStatus.TOSA_VALID:
                raise RuntimeError(f"the TOSA reference model refused delegate {n.name}: {status}")
            return tuple(torch.from_numpy(np.array(o)) for o in outs)

    per_output: list[list[np.ndarray]] = []
    t0 = time.perf_counter()
    for args in _rows(req["inputs"]):
        users = iter(args)
        feed = [consts[s.target] if s.target in consts else next(users) for s in sig.input_specs]
        _stack(per_output, Run(ep.graph_module).run(*feed))
    reply["seconds_per_sample"] = (time.perf_counter() - t0) / max(len(req["inputs"]), 1)
    reply["outputs"] = _record(os.path.join(req["outputs_dir"], "reference"), per_output)


def _serialize(req: dict, st: dict) -> None:
    """The ``.pte`` (last: ``to_executorch`` plans memory in the edge program the steps above read)."""
    with open(req["pte"], "wb") as f:
        f.write(st["manager"].to_executorch().buffer)


def _tflite_steps(req: dict, st: dict, reply: dict) -> list:
    """The ``tflite`` route: vitexport's lowered program → float ``.tflite`` → LiteRT's 16x8 (or int8)
    quantizer on the calibration samples → the LiteRT interpreter on the parity inputs → Vela."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # -I left this folder off the path
    import tflite_worker as tw

    work = req["work_dir"]
    os.makedirs(work, exist_ok=True)
    plain, quant = os.path.join(work, "model.float.tflite"), os.path.join(work, "model.int.tflite")
    reply["activations"], reply["mask_fill"] = req.get("activations", "int16"), req.get("mask_fill", [])

    def interpret() -> None:
        t0 = time.perf_counter()
        outs = tw.interpret(quant, [[np.load(p) for p in row] for row in req["inputs"]])
        reply["seconds_per_sample"] = (time.perf_counter() - t0) / max(len(req["inputs"]), 1)
        reply["outputs"] = reply["quantized_outputs"] = _record(os.path.join(req["outputs_dir"], "litert"), outs)

    def vela() -> None:
        # the client names the system (the target's defaults): no ExecuTorch import, which takes 10-25 s
        reply["system_config"], reply["memory_mode"] = req["system_config"], req["memory_mode"]
        flags = [f"--accelerator-config={req['accelerator']}", "--config=Arm/vela.ini",
                 f"--system-config={req['system_config']}", f"--memory-mode={req['memory_mode']}"]
        st["optimized"], row = tw.compile_vela(quant, flags, os.path.join(work, "vela"))
        reply["partitions"] = [{"tosa": quant, **row}]

    def place() -> None:
        reply["cpu_ops"], reply["delegates"] = tw.placement(st["optimized"])

    def serialize() -> None:
        os.replace(st["optimized"], req["pte"])
        os.replace(quant, req["vela_input"])

    def quantize() -> None:
        tw.quantize(plain, [[np.load(p) for p in row] for row in req["calibration"]], req.get("activations", "int16"),
                    quant, req.get("per_channel", True))
        if "u55" in req["accelerator"] and req.get("activations", "int16") == "int16":
            # Ethos-U55 multiplies two activations in int8 only: its 16x8 BATCH_MATMUL would run on the CPU
            if tw.int8_matmuls(quant):
                reply["int8_ops"] = ["batch_matmul"]

    return [("write", lambda: tw.write_float(req["program"], req["program_npz"], plain)), ("quantize", quantize),
            ("reference", interpret if req.get("inputs") else lambda: None), ("vela", vela),
            ("placement", place), ("serialize", serialize)]


def run_request(req: dict) -> dict:
    """Run one request. ``executorch``: quantize, lower (TOSA + Vela), vela (summaries), placement, reference,
    serialize (``.pte``); ``tflite``: write, quantize, reference (LiteRT), vela, placement, serialize."""
    reply: dict = {"ok": False, "stages": {}, "stage": None, "error": None, "route": req.get("route", "executorch")}
    st: dict = {}
    steps = _tflite_steps(req, st, reply) if reply["route"] == "tflite" else [("quantize", lambda: _quantize(req, st, reply)),
             ("quantized_outputs", lambda: _quantized_outputs(req, st, reply)), ("lower", lambda: _lower(req, st, reply)),
             ("vela", lambda: _vela(req, st, reply)), ("placement", lambda: _placement(st, reply)),
             ("reference", lambda: _reference(req, st, reply) if req.get("inputs") else None),
             ("serialize", lambda: _serialize(req, st))]
    try:
        for name, step in steps:
            reply["stage"] = name
            _save(req, reply)  # a crash inside the step leaves it named in the reply
            print(f"@@vitexport-stage {name}", flush=True)
            t0 = time.perf_counter()
            step()
            reply["stages"][name] = round(time.perf_counter() - t0, 3)
        reply["ok"], reply["stage"] = True, None
    except Exception as exc:  # a toolchain failure is data for the client, not a crash of the worker
        reply["error"] = f"{type(exc).__name__}: {exc}"
        traceback.print_exc()
    _save(req, reply)
    return reply


def main(argv: list[str]) -> int:
    """``python -I worker.py REQUEST.json``: exit 0 when every step ran."""
    if len(argv) != 2:
        print("usage: worker.py REQUEST.json", file=sys.stderr)
        return 2
    with open(argv[1]) as f:
        req = json.load(f)
    return 0 if run_request(req)["ok"] else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
