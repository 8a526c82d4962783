"""The ``kafka-admission-proxy`` command: ``run``, ``check-config``, ``demo``, ``report``."""

from __future__ import annotations

import argparse
import gc
import logging
import resource
import signal
import sys

import trio
import yaml

from .config import Config, ConfigError, load_config
from .logs import setup_logging
from .server import ProxyServer

log = logging.getLogger("kafka_admission_proxy")

EXIT_CONFIG_ERROR = 2


async def serve_until_signalled(config: Config, drain_timeout: float, config_path: str | None = None) -> None:
    server = ProxyServer(config)
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT, signal.SIGHUP) as signals:
        async with trio.open_nursery() as nursery:
            await nursery.start(server.run)
            log.info(
                "proxy ready",
                extra={
                    "listeners": ",".join(f"{lst.name}={lst.bind}" for lst in config.listeners),
                    "admin": f"{config.admin.bind_address[0]}:{server.admin_port}",
                },
            )
            async for signum in signals:
                log.info("received %s", signal.Signals(signum).name)
                if signum == signal.SIGHUP:
                    _reload(server, config_path)
                    continue
                await server.shutdown(drain_timeout)
                break


def _reload(server: ProxyServer, path: str | None) -> None:
    """SIGHUP: re-read the config file; a file that does not validate changes nothing."""
    if path is None:
        log.warning("SIGHUP ignored: no config file to re-read")
        return
    try:
        new = load_config(path)
    except ConfigError as exc:
        log.error("config reload refused, keeping the running config: %s", exc)
        return
    server.reload(new)


def _load_or_exit(path: str) -> Config:
    try:
        return load_config(path)
    except ConfigError as exc:
        print(f"config error in {path}:\n{exc}", file=sys.stderr)
        raise SystemExit(EXIT_CONFIG_ERROR) from None


def _raise_fd_limit() -> None:
    """Two sockets per client connection: take the hard file limit, not the soft default."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def _cmd_run(args: argparse.Namespace) -> int:
    config = _load_or_exit(args.config)
    _raise_fd_limit()
    # Per-request objects are short-lived: collect young garbage less often, and keep
    # the startup heap (modules, codec tables) out of every collection.
    gc.set_threshold(50_000, 20, 20)
    gc.freeze()
    trio.run(serve_until_signalled, config, args.drain_timeout, args.config)
    return 0


def _cmd_check_config(args: argparse.Namespace) -> int:
    config = _load_or_exit(args.config)
    sys.stdout.write(yaml.safe_dump(config.effective(), sort_keys=False))
    return 0


def _cmd_demo(args: argparse.Namespace) -> int:
    from .demo import run_demo

    return run_demo(records=args.records, exit_after_workload=args.exit_after_workload)


def _cmd_report(args: argparse.Namespace) -> int:
    try:  # PySpark comes with the `pipeline` extra; the proxy itself runs without it
        from pipeline.job import main as report_main
    except ImportError as exc:
        print(f"report needs the pipeline extra: pip install '.[pipeline]' ({exc})", file=sys.stderr)
        return EXIT_CONFIG_ERROR
    return report_main(args)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kafka-admission-proxy",
        description="Kafka admission proxy: broker resource limits applied before traffic reaches the broker.",
    )
    logging_options = argparse.ArgumentParser(add_help=False)
    logging_options.add_argument("--log-format", choices=("text", "json"), default="text")
    logging_options.add_argument("--log-level", default="INFO")
    commands = parser.add_subparsers(dest="command", required=True)

    run = commands.add_parser("run", help="run the proxy", parents=[logging_options])
    run.add_argument("--config", required=True, help="YAML config file")
    run.add_argument(
        "--drain-timeout",
        type=float,
        default=30.0,
        help="seconds to let in-flight requests finish on SIGTERM/SIGINT (default 30)",
    )
    run.set_defaults(func=_cmd_run)

    check = commands.add_parser(
        "check-config", help="validate a config and print it with defaults", parents=[logging_options]
    )
    check.add_argument("--config", required=True)
    check.set_defaults(func=_cmd_check_config)

    demo = commands.add_parser(
        "demo",
        help="embedded Tansu broker + this proxy + a sample workload, until Ctrl-C",
        parents=[logging_options],
    )
    demo.add_argument("--records", type=int, default=1000, help="records the workload produces")
    demo.add_argument("--exit-after-workload", action="store_true", help="stop after the workload (for scripts)")
    demo.set_defaults(func=_cmd_demo)

    report = commands.add_parser(
        "report",
        help="policy-impact report from audit events (PySpark): report.html, recommended policies, impact tables",
        parents=[logging_options],
    )
    report.add_argument("--events", nargs="+", required=True, metavar="PATH",
                        help="audit files or directories (JSON lines, or Parquet from --to-parquet)")
    output = report.add_mutually_exclusive_group(required=True)
    output.add_argument("--out", metavar="DIR", help="write report.html, recommended-policies.yaml, impact/ here")
    output.add_argument("--to-parquet", metavar="DIR", help="only convert the events to Parquet in DIR")
    report.add_argument("--master", default="local[*]", help="Spark master (default local[*]; spark://HOST:7077)")
    report.add_argument("--candidate", action="append", default=[], metavar="KEY=VALUE",
                        help="a limit to evaluate, e.g. group.max.size=50 (repeatable)")
    report.add_argument("--headroom", type=float, default=20.0, metavar="PCT",
                        help="recommended limits: observed peak + PCT percent (default 20)")
    report.set_defaults(func=_cmd_report)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    setup_logging(args.log_format, args.log_level)
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
