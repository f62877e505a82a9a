"""`python -m app.lanes.workers.llamacpp --ppid N --params JSON`: host llama.cpp's HTTP server.

xllamacpp runs llama.cpp's own C++ server inside this process on a free loopback port. We
print one JSON line `{"switchyard": "listening", "port": P, "ready": true}` on stdout once the
model is loaded and the server answers (the lane takes that as readiness, without polling),
exit 0 on SIGTERM, and exit on our own when the parent process is gone.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import sys
import threading
import time
from typing import Any

from app.core.platform.signals import on_stop_signals_plain
from app.lanes.parentwatch import set_pdeathsig, tie_to_server
from app.lanes.workers.params import LlamaParams, worker_command_line

_KV = {
    "f32": "GGML_TYPE_F32",
    "f16": "GGML_TYPE_F16",
    "bf16": "GGML_TYPE_BF16",
    "q8_0": "GGML_TYPE_Q8_0",
    "q4_0": "GGML_TYPE_Q4_0",
    "q4_1": "GGML_TYPE_Q4_1",
    "q5_0": "GGML_TYPE_Q5_0",
    "q5_1": "GGML_TYPE_Q5_1",
    "iq4_nl": "GGML_TYPE_IQ4_NL",
}
_FA = {
    "auto": "LLAMA_FLASH_ATTN_TYPE_AUTO",
    "on": "LLAMA_FLASH_ATTN_TYPE_ENABLED",
    "off": "LLAMA_FLASH_ATTN_TYPE_DISABLED",
}
LOAD_VERBOSITY = 4  # level 4 prints the buffer sizes that the measured footprint is read from
# serving: info and up (a request's timings, warnings, errors): level 4 writes ~3x the lines per request,
# and every line costs the gateway CPU to read
SERVE_VERBOSITY = 3


def _common_params(x: Any, p: LlamaParams) -> Any:
    cp = x.CommonParams()
    cp.model.path = p.model_path
    cp.model_alias = {p.alias}
    cp.n_ctx = p.ctx_size
    cp.n_parallel = p.parallel
    cp.cpuparams.n_threads = p.threads
    cp.cpuparams_batch.n_threads = p.threads
    cp.cache_type_k = getattr(x.ggml_type, _KV[p.kv_type])
    cp.cache_type_v = getattr(x.ggml_type, _KV[p.kv_type])
    cp.flash_attn_type = getattr(x.llama_flash_attn_type, _FA[p.flash_attn])
    cp.n_gpu_layers = p.gpu_layers
    cp.endpoint_slots = True
    cp.endpoint_metrics = True
    if hasattr(cp, "hostnames"):
        cp.hostnames = ["127.0.0.1"]
    else:  # xllamacpp before 2026.5 listens on one `hostname`
        cp.hostname = "127.0.0.1"
    cp.port = 0
    cp.cache_ram_mib = p.cache_ram_mib
    if p.slot_save_path:
        cp.slot_save_path = p.slot_save_path  # /slots save and restore read and write only here
    if p.mmproj_path:
        cp.mmproj.path = p.mmproj_path
        cp.mmproj_use_gpu = p.mmproj_use_gpu
    _speculative(x, cp.speculative, p)
    if p.lora_paths:
        pairs = zip(p.lora_paths, p.lora_scales, strict=True)
        cp.lora_adapters = [_adapter(x, path, scale) for path, scale in pairs]
    cp.verbosity = LOAD_VERBOSITY
    if p.batch_size > 0:
        cp.n_batch = p.batch_size
        cp.n_ubatch = p.batch_size
    if p.embedding:
        cp.embedding = True
        cp.pooling_type = getattr(x.llama_pooling_type, f"LLAMA_POOLING_TYPE_{(p.pooling or 'mean').upper()}")
    return cp


def _speculative(x: Any, sp: Any, p: LlamaParams) -> None:
    """Speculative decoding on the engine's own parameters; it ignores the per-request fields."""
    if not p.spec_type:
        return
    sp.types = [getattr(x.common_speculative_type, f"COMMON_SPECULATIVE_TYPE_{p.spec_type.upper()}")]
    # each n-gram kind keeps its knobs on its own struct; a negative value keeps the engine's default
    knobs: list[tuple[Any, str, float]] = []
    if p.spec_type in ("ngram_simple", "ngram_map_k", "ngram_map_k4v"):
        table = getattr(sp, p.spec_type)
        knobs = [(table, "size_n", p.spec_size_n), (table, "size_m", p.spec_size_m)]
        knobs.append((table, "min_hits", p.spec_min_hits))
    elif p.spec_type == "ngram_mod":
        m = sp.ngram_mod
        knobs = [(m, "n_match", p.spec_n_match), (m, "n_min", p.spec_n_min), (m, "n_max", p.spec_n_max)]
    elif p.spec_type == "draft_simple":
        d = sp.draft
        d.mparams.path = p.draft_path
        d.n_gpu_layers = p.draft_gpu_layers
        knobs = [(d, "n_max", p.spec_n_max), (d, "n_min", p.spec_n_min), (d, "p_min", p.spec_p_min)]
    for target, name, value in knobs:
        if value >= 0:
            setattr(target, name, type(getattr(target, name))(value))


def _adapter(x: Any, path: str, scale: float) -> Any:
    info = x.CommonAdapterLoraInfo()
    info.path = path
    info.scale = scale
    return info


def _flush_llama_log(x: Any) -> Any:
    """Write out llama.cpp's queued log lines (its logger runs on a thread: lines still queued when the
    process exits are lost, among them the reason a load failed). Returns the library, for more calls."""
    lib = ctypes.CDLL(x.xllamacpp.__file__)
    main_log = lib._Z15common_log_mainv  # common_log_main()
    main_log.restype = ctypes.c_void_p
    flush = lib._Z16common_log_flushP10common_log  # common_log_flush(common_log *)
    flush.argtypes = [ctypes.c_void_p]
    flush(main_log())
    return lib


def _quiet_llama_log(x: Any) -> None:
    """Write out llama.cpp's queued load lines before we say we are ready, then lower its verbosity for
    serving. Both are C++ functions the wheel exports but does not wrap; without them the lane still
    works, reading the lines as they come and more of them per request."""
    try:
        lib = _flush_llama_log(x)
        lib._Z30common_log_set_verbosity_tholdi(ctypes.c_int(SERVE_VERBOSITY))
    except (OSError, AttributeError) as exc:
        print(f"switchyard-worker: cannot adjust llama.cpp's log ({exc}); keeping it", file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    # first of all: from here on the kernel kills us with the server, even inside llama.cpp's load or teardown
    set_pdeathsig()
    ppid, params_json = worker_command_line("app.lanes.workers.llamacpp", argv)
    if not tie_to_server(ppid):
        return 3
    stop = threading.Event()
    on_stop_signals_plain(lambda *_: stop.set())  # SIGTERM/SIGINT/SIGHUP; Ctrl-Break/Ctrl-C on Windows
    params = LlamaParams.from_json(params_json)
    if not os.path.isfile(params.model_path):
        print(f"switchyard-worker: model file not found: {params.model_path}", file=sys.stderr, flush=True)
        return 4
    for extra in (params.draft_path, *params.lora_paths):
        if extra and not os.path.isfile(extra):
            print(f"switchyard-worker: file not found: {extra}", file=sys.stderr, flush=True)
            return 4
    if params.mmproj_path and not os.path.isfile(params.mmproj_path):
        print(
            f"switchyard-worker: vision projector not found: {params.mmproj_path}",
            file=sys.stderr,
            flush=True,
        )
        return 4
    import xllamacpp  # imported late: a missing wheel is reported by the parent, not a traceback here

    t0 = time.monotonic()
    try:
        server = xllamacpp.Server(_common_params(xllamacpp, params))
    except RuntimeError as exc:
        with contextlib.suppress(OSError, AttributeError):
            _flush_llama_log(xllamacpp)  # the load error itself, before our summary line and the exit
        what = (
            f"the model or its vision projector {params.mmproj_path}" if params.mmproj_path else "the model"
        )
        print(f"switchyard-worker: llama.cpp could not load {what}: {exc}", file=sys.stderr, flush=True)
        return 5
    load_s = time.monotonic() - t0
    # Server() returns once the model is loaded and the socket listens (its first /health answers 200)
    address = str(server.listening_address)
    port = int(address.rsplit(":", 1)[1].split("/")[0])
    _quiet_llama_log(xllamacpp)
    print(json.dumps({"switchyard": "listening", "port": port, "ready": True, "load_s": load_s}), flush=True)
    while not stop.wait(0.5):
        pass
    del server  # joins llama.cpp's loop and frees the model
    sys.stdout.flush()
    sys.stderr.flush()
    # skip interpreter teardown: destroying the extension's statics at exit has been seen to hang
    os._exit(0)


if __name__ == "__main__":
    raise SystemExit(main())
