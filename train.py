"""Train a GPT: python train.py --config shakespeare_char [--name=value ...] [--sweep name=a,b]

Every option is a field of gpt.config (python train.py --help lists them). With --sweep axes or
a sweep config, runs the whole grid (see gpt.sweep)."""

import signal
import sys
from pathlib import Path

from gpt.console import interrupt_quietly_while_loading, loaded, output_may_close

interrupt_quietly_while_loading(__name__)      # before torch loads
from gpt.sweep import runner, submit  # noqa: E402
from gpt.train import loop, outcome, resume, signals, source  # noqa: E402
from gpt.cli import help_text, parse_argv  # noqa: E402
from gpt.config import SweepConfig, TrainConfig, build  # noqa: E402
from gpt.config_files import SECTIONS  # noqa: E402
from gpt.errors import UserError, say_error  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    loaded()        # a Ctrl-C from here on stops the run as run() says
    argv = sys.argv[1:] if argv is None else argv
    if "-h" in argv or "--help" in argv:
        with output_may_close(product=True):
            print(help_text("train.py", SECTIONS))
        return 0
    with output_may_close():    # | head, a full disk or 2>&- must not end a run before its checkpoint
        return run(argv)


def run(argv: list[str]) -> int:
    sweeping, args = False, None
    try:
        args = parse_argv(argv)
        grid = build(SweepConfig, args.values)      # built to check
        sweeping = bool(args.sweep) or bool(args.tune) or grid.seeds > 1
        if sweeping:
            return runner.run(args, argv, entry=main)   # forked runs train by main, as fresh ones do
        if grid.launcher != "local":
            raise UserError(f"launcher={grid.launcher} runs the runs of a sweep, but this is one run; give "
                            "--sweep name=a,b or --seeds=N, or leave --launcher out")
        submit.check_options(args, grid.launcher)
        if grid.jobs > 1:
            raise UserError(f"jobs={grid.jobs} runs several runs of a sweep at once, but this is one run; "
                            "give --sweep name=a,b or --seeds=N, or leave --jobs out")
        model_cfg, train_cfg = resume.configs_for_run(args.values)
        if train_cfg.init_from and not train_cfg.resume:    # a resume's weights are its own
            on_command_line = set(args.values) - set(args.from_file)
            model_cfg = source.shaped(model_cfg, args.values, on_command_line, source.resolve(train_cfg.init_from))
        summary = loop.train(model_cfg, train_cfg, argv)
    except loop.Diverged as e:
        say_error(e)
        return outcome.DIVERGED_EXIT
    except loop.Hopeless as e:
        say_error(e)
        return outcome.PRUNED_EXIT
    except UserError as e:
        say_error(e, args.blame(str(e)) if args else None)
        return 2
    except KeyboardInterrupt:   # Ctrl-C at start-up, or a second one: no checkpoint is cut short
        out_dir = Path(args.values.get("out_dir", TrainConfig.out_dir)) if args else None
        print("sweep interrupted; run the same command again to continue" if sweeping else
              "interrupted; a checkpoint already saved is whole, and --resume continues from it"
              if out_dir and (out_dir / "ckpt.pt").exists() else "interrupted; no checkpoint was saved",
              file=sys.stderr)
        return 130
    return outcome.PAUSED_EXIT if summary.get("paused") else signals.exit_status(summary["stopped_by"])


if __name__ == "__main__":
    status = main()
    # the run is over and said so: a late Ctrl-C must not put a traceback under it from an exit hook
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    sys.exit(status)
