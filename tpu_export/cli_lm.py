"""The LLM subcommands of tpu-export: ``convert-lm`` (targets.lm.convert_lm) and ``generate``
(tpu_export.generators); cli.py adds them to its parser."""

from __future__ import annotations

import sys

__all__ = ["add_lm_commands", "cmd_convert_lm", "cmd_generate"]


def cmd_convert_lm(a) -> int:
    from .cli_check import CliError, check_options, check_scheme

    cli = _cli()
    # the command line first, before transformers and torch are imported or the model directory is read
    items = [(item, *cli._target_spec(item)) for item in a.target]
    if len({name for _, name, _ in items}) != len(items):
        raise CliError("a target is named twice; give each --target once (its options after a colon)")
    shared = {}
    if a.quantize is not None:
        try:
            shared["quant_config"] = (f"--quantize {a.quantize}", check_scheme(a.quantize))
        except CliError as e:
            raise CliError(f"--quantize {a.quantize}: {e}") from None
    check_options(items, shared, llm=True)
    try:
        lengths = tuple(int(x) for x in a.prefill.split(",") if x.strip())
    except ValueError:
        raise CliError(f"--prefill takes lengths separated by commas (e.g. 32,128), got {a.prefill!r}") from None
    if not lengths or min(lengths) < 1:
        raise CliError(f"--prefill takes positive lengths separated by commas (e.g. 32,128), got {a.prefill!r}")
    if a.cache is not None and a.cache < 1:
        raise CliError(f"--cache takes a positive number of slots, got {a.cache}")
    from tpu_export.targets.lm import convert_lm

    if a.quiet:  # transformers' weight-loading progress bar too (a setting of this process)
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
    written = convert_lm(a.model_dir, {name: opts for _, name, opts in items}, a.output, prefill_lengths=lengths,
                         cache_len=a.cache, quantize=a.quantize, progress=cli._progress(a.quiet),
                         allow_nonfinite_weights=a.allow_nonfinite_weights, verify=not a.no_verify)
    for t, files in written.items():
        for f, p in sorted(files.items()):
            if f.startswith("model."):
                print(f"{t}: {p}")
    return 0


def cmd_generate(a) -> int:
    from .generate import GenerateArgumentError, Sampling, check_generate_args
    from .generators import load_generator

    try:  # the arguments first (the flags by name), then the model; its vocabulary bounds --top-k
        sampling = Sampling(temperature=a.temperature, top_k=a.top_k, top_p=a.top_p, seed=a.seed)
        check_generate_args(a.prompt, a.max_new_tokens, sampling)
        gen = load_generator(a.artifact, verbose=a.verbose, isolate=a.isolate, isolate_timeout=a.isolate_timeout)
        res = gen.generate(a.prompt, a.max_new_tokens, sampling=sampling, chat=a.chat,
                           on_text=lambda s: print(s, end="", flush=True))
    except GenerateArgumentError as e:
        raise _cli().CliError(e.for_cli()) from None
    print(flush=True)
    print(res.timing_line(), file=sys.stderr, flush=True)
    return 0


def _cli():
    from . import cli  # the shared helpers (target specs, progress, CliError); imported late: cli imports us

    return cli


def add_lm_commands(sub) -> None:
    from .cli import examples

    lm = sub.add_parser(
        "convert-lm", help="convert a causal LM (Hugging Face folder) with its KV cache",
        description="Convert a causal LM with its KV cache: for edge targets OUT/<target>/model.litertlm (the "
                    "LiteRT-LM bundle) and model.tflite, for TPU/XLA targets OUT/<target>/model.tpuexp; each "
                    "target folder also holds lm.json and tokenizer.json. Each artifact's prefill logits are "
                    "checked against the source model before anything is published.",
        epilog=examples(
            "# out/android/model.litertlm (+ model.tflite, lm.json, tokenizer.json)",
            "tpu-export convert-lm my_llm_dir/ --target android -o out",
            "# + out/tpu-v6e/model.tpuexp; signatures prefill_32, prefill_128 and decode, 1024 cache slots",
            "tpu-export convert-lm my_llm_dir/ --target android --target tpu-v6e --prefill 32,128 --cache 1024 "
            "-o out",
            "# int8 weights on the phone, bfloat16 on the TPU",
            "tpu-export convert-lm my_llm_dir/ --target android:quantize=dynamic_int8 --target tpu-v6e:dtype=bfloat16 "
            "-o out",
            "# + decode_slots over 32 requests: `tpu-export serve` batches them continuously",
            "tpu-export convert-lm my_llm_dir/ --target tpu-v6e:slots=32 -o out"))
    lm.add_argument("model_dir", help="a local Hugging Face model directory: config.json, *.safetensors, "
                                      "tokenizer.json (nothing is downloaded; pickled weights are refused)")
    lm.add_argument("--target", action="append", required=True, metavar="NAME[:KEY=VALUE,...]",
                    help="required, repeatable: android, ios, web, cpu, tpu-v5e, tpu-v6e, tpu-v5p, tpu-v7x, cpu-xla, "
                         "cuda; options after a colon as for convert (e.g. tpu-v6e:dtype=bfloat16,topology=2x2)")
    lm.add_argument("-o", "--output", required=True, metavar="OUT", help="required: output directory (replaced as "
                                                                          "a whole)")
    lm.add_argument("--prefill", default="32", metavar="L1,L2",
                    help="prefill lengths, separated by commas (signatures prefill_<L>)")
    lm.add_argument("--cache", type=int, default=None, metavar="N",
                    help="KV cache slots = the most tokens a session holds (default: 1024)")
    lm.add_argument("--quantize", metavar="SCHEME", help="edge: dynamic_int8, weight_only_int8, weight_only_int4, "
                                                         "dynamic_int4_block32, fp16; TPU: weight_only_int8; per "
                                                         "target: NAME:quantize=SCHEME (default: none, float)")
    lm.add_argument("--cache-dir", metavar="DIR",
                    help="TPU targets: the AOT compile cache, as for convert; 'none': no cache "
                         "(default: $TPU_EXPORT_AOT_CACHE, else ~/.cache/tpu-export/aot)")
    lm.add_argument("--allow-nonfinite-weights", action="store_true",
                    help="convert a model whose weights hold NaN or infinity (warned) instead of refusing it")
    lm.add_argument("--no-verify", action="store_true",
                    help="publish without checking each artifact's prefill logits against the source model's own "
                         "forward on a sample prompt (the check refuses a conversion whose logits differ past the "
                         "target's bound)")
    lm.add_argument("--quiet", action="store_true", help="no progress lines on stderr (errors and warnings still)")
    lm.add_argument("--verbose", action="store_true",
                    help="on an error, print its chain of causes with their tracebacks after the one-line message")
    lm.set_defaults(fn=cmd_convert_lm)

    g = sub.add_parser(
        "generate", help="generate text from a .litertlm, TPU artifact or .tflite",
        description="Generate text from a .litertlm (LiteRT-LM engine), a TPU artifact or a .tflite written by "
                    "convert-lm, streamed to stdout as it is produced; the timing line goes to stderr.",
        epilog=examples(
            "tpu-export generate out/android/model.litertlm --prompt \"Once upon a time\" --max-new-tokens 64",
            "tpu-export generate out/tpu-v6e --prompt \"Hi\" --temperature 0.8 --top-p 0.9 --seed 1 --chat",
            "tpu-export generate out/android/model.tflite --prompt \"Hi\" --top-k 40 --temperature 0.7"))
    g.add_argument("artifact", help="a .litertlm, model.tpuexp, model.tflite, or a target folder of convert-lm")
    g.add_argument("--prompt", required=True, help="required: the text to continue")
    g.add_argument("--max-new-tokens", type=int, default=64, metavar="N", help="the most tokens to generate")
    g.add_argument("--temperature", type=float, default=0.0, metavar="T", help="sampling temperature; 0: greedy")
    g.add_argument("--top-k", type=int, metavar="K", help="sample among the K likeliest tokens (default: all)")
    g.add_argument("--top-p", type=float, metavar="P",
                   help="sample among the likeliest tokens whose probabilities add up to P (default: 1, all)")
    g.add_argument("--seed", type=int, help="sampling seed: the same seed, the same text (default: a random one)")
    g.add_argument("--chat", action="store_true", help="wrap the prompt in the model's chat template")
    g.add_argument("--verbose", action="store_true", help="show the LiteRT-LM engine's own log lines")
    g.add_argument("--isolate", action="store_true",
                   help=".litertlm from untrusted sources: run the LiteRT-LM engine in a child process (the bundle is "
                        "checked structurally first; a crash on bytes the check cannot judge, such as weights, is "
                        "then one error line naming the signal); ~1 s more")
    g.add_argument("--isolate-timeout", type=float, default=None, metavar="S",
                   help="with --isolate: seconds the engine may go without an answer (default: 60)")
    g.set_defaults(fn=cmd_generate)
