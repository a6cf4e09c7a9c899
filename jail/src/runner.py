"""jail's script runner: `jail run`'s script, run as `python SCRIPT ARGS`
runs it, with its rich results (shown.py, which the jail puts before
this) sent to the supervisor on the control channel.

Started as `python -c RUNNER SCRIPT ARGS...`, the control socket on fd 0
(moved to a private close-on-exec descriptor at once; fd 0 then reads
/dev/null, as a script's stdin always does). The script gets what Python
gives a script: `sys.argv`, `sys.path[0]` its folder, a `__main__` module
with its `__file__`; a traceback starts in the script, an uncaught
exception exits 1, SystemExit and KeyboardInterrupt end the process as
they would. Its last expression's value, `display(obj)` and its figures
are its results.
"""


def run_script():
    import builtins

    _, ctl = take_control_fd()
    results = Shown(ctl)
    results.cell = (0, "")
    inline_backend(results)
    script = sys.argv[1]
    sys.argv = sys.argv[1:]
    sys.path[0] = os.path.dirname(script)
    main = type(sys)("__main__")
    main.__file__ = script
    main.__builtins__ = builtins
    main.__spec__ = None
    main.__package__ = None
    main.__cached__ = None
    builtins.display = results.display
    sys.modules["__main__"] = main
    try:
        with open(script, "rb") as f:
            source = f.read()
        body, last = split_last(source, script)
        body, last = compile(body, script, "exec"), last and compile(last, script, "eval")
    except (SyntaxError, ValueError) as e:
        # As the interpreter says it of a script that does not compile.
        sys.excepthook(type(e), e, e.with_traceback(None).__traceback__)
        sys.exit(1)
    try:
        exec(body, main.__dict__)
        if last is not None:
            value = eval(last, main.__dict__)
            if value is not None:
                results.emit(value, main=True)
    except SystemExit:
        results.flush_figures(shown=False)
        raise
    except KeyboardInterrupt as e:
        results.flush_figures(shown=False)
        import signal
        import traceback

        e = e.with_traceback(e.__traceback__.tb_next)
        traceback.print_exception(type(e), e, e.__traceback__)
        sys.stderr.flush()
        # As the interpreter ends on an uncaught KeyboardInterrupt: by SIGINT.
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    except BaseException as e:
        results.flush_figures(shown=False)
        # The traceback starts in the script (this frame is not its).
        e = e.with_traceback(e.__traceback__.tb_next)
        sys.excepthook(type(e), e, e.__traceback__)
        sys.exit(1)
    else:
        results.flush_figures(shown=False)


run_script()
