"""Service settings from the environment, with refusals for unsafe combinations."""

from __future__ import annotations

import ipaddress
import os
from dataclasses import dataclass, field

MAX_BODY_BYTES = 1024 * 1024


_LOOPBACK_V4 = ipaddress.ip_network("127.0.0.0/8")


def is_loopback(host: str) -> bool:
    """Exactly 127.0.0.0/8, ``::1`` and ``localhost``. Anything else, the empty string included (uvicorn
    binds every interface for it), and IPv4-mapped or hostnames that merely resolve to loopback, is not."""
    if host == "localhost":
        return True
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return False
    if isinstance(address, ipaddress.IPv4Address):
        return address in _LOOPBACK_V4
    return address == ipaddress.IPv6Address("::1") and address.scope_id is None


@dataclass(frozen=True)
class Settings:
    """``token``: bearer token for writes (and for reads when ``public_reads`` is off);
    ``host``: where the server is bound, to decide what loopback-only defaults apply."""

    db_url: str | None = None
    token: str | None = None
    host: str = "127.0.0.1"
    cors_origins: tuple[str, ...] = field(default_factory=tuple)
    public_reads: bool | None = None
    max_body_bytes: int = MAX_BODY_BYTES

    @classmethod
    def from_env(cls, host: str = "127.0.0.1", db_url: str | None = None) -> Settings:
        origins = tuple(o.strip() for o in os.environ.get("TUNER_CORS_ORIGINS", "").split(",") if o.strip())
        public = os.environ.get("TUNER_PUBLIC_READS")
        return cls(
            db_url=db_url or os.environ.get("TUNER_DB_URL"),
            token=os.environ.get("TUNER_API_TOKEN") or None,
            host=host,
            cors_origins=origins,
            public_reads=None if public is None else public.lower() in ("1", "true", "yes"),
        )

    @property
    def reads_need_token(self) -> bool:
        """Reads are open on loopback by default; beyond it they need the token unless TUNER_PUBLIC_READS=1."""
        if self.public_reads is not None:
            return not self.public_reads and self.token is not None
        return not is_loopback(self.host)

    def check(self) -> None:
        """Refuse to serve beyond loopback without a token."""
        if not is_loopback(self.host) and not self.token:
            raise SystemExit(
                f"refusing to bind {self.host or 'every interface (empty host)'} without TUNER_API_TOKEN: "
                "writes would be open to the network"
            )
