"""Write text with a trained model: python sample.py --out_dir=DIR --start="ROMEO:" [...]

The checkpoint carries the model's config and vocabulary, so nothing else is needed."""

import sys
from pathlib import Path

from gpt.cli import help_text, parse_argv   # torch loads in sample()
from gpt.config import SampleConfig, build
from gpt.errors import UserError, say_error
from gpt.console import output_may_close, silence


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if "-h" in argv or "--help" in argv:
        with output_may_close(product=True):
            print(help_text("sample.py", (SampleConfig,)))
        return 0
    try:
        cfg = build(SampleConfig, parse_argv(argv, (SampleConfig,)).values)
        if sys.stdout is None:
            raise UserError("standard output is closed: there is nowhere to write the samples")
        for text in sample(cfg):
            try:
                sys.stdout.write(text)
                sys.stdout.flush()
            except UnicodeEncodeError as e:     # a console or PYTHONIOENCODING short of UTF-8
                raise UserError(f"standard output's encoding ({e.encoding}) cannot write "
                                f"{e.object[e.start:e.end]!r}; set PYTHONIOENCODING=utf-8") from None
            except OSError as e:
                silence(sys.stdout)     # what is left in its buffer must not fail again at exit
                if isinstance(e, BrokenPipeError):      # the reader went away (| head): stop quietly
                    return 0
                raise UserError(f"cannot write the samples to standard output ({e.strerror})") from None
    except UserError as e:
        say_error(e)
        return 2
    except KeyboardInterrupt:
        return 130
    return 0


def sample(cfg: SampleConfig):
    """Yield the text of each sample piece by piece, as it is generated."""
    import torch

    from gpt import checkpoint
    from gpt.speed.threads import sampling_threads
    from gpt.tokenizers import encode_prompt, read_prompt
    from gpt.train.runtime import check_threads, resolve_device

    check_threads(cfg)
    device = resolve_device(cfg.device)
    if cfg.init_from:
        from gpt.train import source
        model, tok = source.load_source_for_sampling(cfg.init_from, device)
    else:
        name, otherwise = checkpoint.chosen(Path(cfg.out_dir), cfg.ckpt, "samples")
        model, tok = checkpoint.load_for_sampling(cfg.out_dir, device, name, otherwise)
    prompt = read_prompt(cfg.start)
    ids = encode_prompt(tok, prompt, default=cfg.start == SampleConfig.start)
    if not ids:
        raise UserError("--start is empty; give at least one character")
    generator = torch.Generator(device=device).manual_seed(cfg.seed)
    for i in range(cfg.num_samples):
        yield prompt
        idx = torch.tensor([ids], dtype=torch.long, device=device)
        stream = sampling_threads(model.generate_stream(idx, cfg.max_new_tokens, cfg.temperature,
                                                        cfg.top_k or None, cfg.top_p, cfg.use_cache,
                                                        generator), cfg.threads, torch.device(device))
        pending = []
        for token in stream:
            pending.append(token.item())
            text = tok.decode(pending)
            if not text.endswith("\ufffd"):   # a BPE token may end inside a character
                yield text
                pending = []
        if pending:
            yield tok.decode(pending)
        yield "\n" + ("-" * 40 + "\n" if i < cfg.num_samples - 1 else "")


if __name__ == "__main__":
    with output_may_close(stdout=False):    # stdout is the samples': main handles it
        sys.exit(main())
