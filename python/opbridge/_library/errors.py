"""The one exception type opbridge raises for usage errors."""


class OpbridgeError(RuntimeError):
    """An opbridge usage error with a one-line explanation."""


def exception_chain(error: BaseException):
    """(exception, its traceback's frames, outermost first) for `error` and every exception it
    wraps (__cause__, else __context__), each once."""
    seen, cur = set(), error
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        frames = []
        tb = cur.__traceback__
        while tb is not None:
            frames.append(tb.tb_frame)
            tb = tb.tb_next
        yield cur, frames
        cur = cur.__cause__ or cur.__context__
