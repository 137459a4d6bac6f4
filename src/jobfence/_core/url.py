"""Backend URLs: parsing, validation and password masking."""

from __future__ import annotations

from dataclasses import dataclass, field
from urllib.parse import parse_qsl, quote, unquote, urlsplit, urlunsplit

from ..errors import ConfigurationError

__all__ = ["BackendURL", "mask_url", "parse_url"]


@dataclass(frozen=True)
class BackendURL:
    """A parsed backend URL. ``options`` holds the query-string options jobfence reads."""

    raw: str
    scheme: str
    host: str | None
    port: int | None
    username: str | None
    password: str | None
    path: str
    options: dict[str, str] = field(default_factory=dict)

    @property
    def masked(self) -> str:
        return mask_url(self.raw)

    def pop_option(self, name: str, default: str | None = None) -> str | None:
        return self.options.get(name, default)

    def without_options(self, *names: str) -> str:
        """The raw URL with the given query options removed (for handing to a driver)."""
        parts = urlsplit(self.raw)
        kept = [(k, v) for k, v in parse_qsl(parts.query, keep_blank_values=True) if k not in names]
        query = "&".join(f"{quote(k)}={quote(v)}" for k, v in kept)
        return urlunsplit((parts.scheme, parts.netloc, parts.path, query, parts.fragment))


def mask_url(url: str) -> str:
    """Return ``url`` with any password replaced by ``***``."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return "<unparseable url>"
    if parts.password is None:
        return url
    netloc = parts.netloc
    userinfo, _, hostport = netloc.rpartition("@")
    user = userinfo.split(":", 1)[0]
    return urlunsplit((parts.scheme, f"{user}:***@{hostport}", parts.path, parts.query, ""))


def parse_url(url: object, *, argument: str = "url") -> BackendURL:
    """Parse and validate a backend URL; raise :class:`ConfigurationError` naming ``argument``."""
    if not isinstance(url, str) or not url:
        raise ConfigurationError(
            f"{argument} must be a non-empty URL string such as 'redis://localhost:6379/0', "
            f"'sqlite:///path/to/file.db' or 'memory://'; got {url!r}",
            argument=argument,
        )
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise ConfigurationError(
            f"{argument} is not a valid URL ({exc}): {mask_url(url)}", argument=argument
        ) from None
    scheme = parts.scheme.lower()
    from ..backends import registered  # the one list of schemes (imported late: it imports us)

    known = registered()
    if scheme not in known:
        raise ConfigurationError(
            f"{argument} has unknown scheme {parts.scheme!r} in {mask_url(url)}; allowed: "
            + ", ".join(f"{s}://" for s in known),
            argument=argument,
        )
    options = dict(parse_qsl(parts.query, keep_blank_values=True))
    return BackendURL(
        raw=url,
        scheme=scheme,
        host=parts.hostname,
        port=port,
        username=unquote(parts.username) if parts.username else None,
        password=unquote(parts.password) if parts.password else None,
        path=unquote(parts.path),
        options=options,
    )
