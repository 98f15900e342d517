"""-x/-X error filters, applied to assembled sessions in user space (as retsnoop does)."""

from collections.abc import Iterable, Mapping
from typing import NamedTuple

from retsnoop_otel.capture.errnos import parse_errno
from retsnoop_otel.capture.model import RetKind, Session, TracedFunc, error_type

NULL = "NULL"


class ErrorFilter(NamedTuple):
    """Deny wins; an empty allow set (or 'any') allows every error."""

    allow: frozenset[str] = frozenset()
    deny: frozenset[str] = frozenset()

    @classmethod
    def parse(cls, allow: Iterable[str], deny: Iterable[str]) -> "ErrorFilter":
        def norm(items: Iterable[str], flag: str) -> frozenset[str]:
            out = set()
            for item in items:
                for part in item.split(","):
                    part = part.strip()
                    if not part or part.lower() == "any":
                        continue
                    if part.upper() == NULL:
                        out.add(NULL)
                        continue
                    try:
                        num = parse_errno(part)
                    except ValueError as exc:
                        raise ValueError(f"{flag}: {exc}") from None
                    out.add(error_type((1 << 64) - num, RetKind.SIGNED) or part)
            return frozenset(out)

        return cls(norm(allow, "-x/--allow-errors"), norm(deny, "-X/--deny-errors"))

    def accepts(self, session: Session, funcs: Mapping[int, TracedFunc]) -> bool:
        errors = set()
        for entry in session.chain:
            func = funcs.get(entry.func_id)
            if func is None or entry.latency_ns is None:
                continue
            et = error_type(entry.result, func.ret)
            if et:
                errors.add(et)
        if errors & self.deny:
            return False
        if self.allow:
            return bool(errors & self.allow)
        return True
