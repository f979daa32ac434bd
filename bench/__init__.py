"""``make bench``: vitexport's INT8 beside NNCF, ModelOpt and plain ``quantize_static`` (issue 11).

Every measurement runs in its own child process (``python -m bench.worker``, or ``bench.peers`` in the
peers' own venv) so that peak memory is that measurement's alone and a calibration that runs away is
killed instead of taking the machine down. ``bench.run`` is the command line, ``bench.casebench``
walks issue 11's cases (``bench.cases``), ``bench.report_cases`` renders ``bench/results.md``; the
earlier vitexport-vs-plain bench is ``--plan legacy`` (``bench.report``). See ``bench/README.md``.
"""
__all__: list[str] = []
