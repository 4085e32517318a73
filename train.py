"""Train a GPT: python train.py --config shakespeare_char [--name=value ...] [--sweep name=a,b]

Every option is a field of gpt.config (python train.py --help lists them). With --sweep axes or
a sweep config, runs the whole grid (see gpt.sweep)."""

import sys

from gpt.config import SECTIONS, UserError, help_text, parse_argv


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if "-h" in argv or "--help" in argv:
        print(help_text("train.py", SECTIONS))
        return 0
    from gpt import sweep, trainer
    try:
        args = parse_argv(argv)
        if args.sweep or args.values.get("seeds", 1) > 1:
            return sweep.run(args, argv)
        model_cfg, train_cfg = trainer.configs_for_run(args.values)
        summary = trainer.train(model_cfg, train_cfg, argv)
    except trainer.Diverged as e:
        print(f"error: {e}", file=sys.stderr)
        return trainer.DIVERGED_EXIT
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 130 if summary["stopped_by"] else 0


if __name__ == "__main__":
    sys.exit(main())
