"""Backend URLs: parsing, and masking of every secret a URL can carry.

Which schemes exist is the registry's business: :func:`jobfence.backends.parse_backend_url`
parses a URL with :func:`parse_url` and refuses a scheme no backend serves."""

from __future__ import annotations

from dataclasses import dataclass, field
from urllib.parse import parse_qsl, quote, unquote, urlsplit, urlunsplit

from ..errors import ConfigurationError

__all__ = ["MASK", "BackendURL", "is_secret_option", "mask_url", "parse_url"]

#: what every secret is replaced with in messages, reprs, ``url`` attributes and logs
MASK = "***"

#: a query option whose name contains one of these (lower case, ``_`` and ``-`` removed)
#: carries a secret: ``password``, ``passwd``, ``sslpassword``, ``pwd``, ``sslkey``,
#: ``ssl_keyfile``, ``token``, ``access_token``, ``client_secret``, ``auth``, ...
_SECRET_PARTS = ("pass", "pwd", "secret", "token", "key", "credential", "auth")

_HINT = (
    "percent-encode '@', ':', '/', '?', '#' and '%' in a user name or password, e.g. "
    "urllib.parse.quote(password, safe='')"
)


def is_secret_option(name: str) -> bool:
    """Whether the query option ``name`` carries a secret (its value is masked)."""
    flat = unquote(name).lower().replace("_", "").replace("-", "")
    return any(part in flat for part in _SECRET_PARTS)


def _split_userinfo(url: str) -> tuple[str, str | None, str]:
    """(``scheme://``, the user-info or ``None``, the rest) of ``url``, splitting at the LAST
    ``@`` after ``scheme://``: a password with an unencoded ``/``, ``?`` or ``#`` ends the
    host part early for a standard parser, so its tail would land in the path or query."""
    start = url.find("://")
    if start < 0:  # no authority; "user:password@host" without a scheme still hides its "@"
        at = url.rfind("@")
        return ("", url[:at], url[at + 1 :]) if at >= 0 else ("", None, url)
    head, body = url[: start + 3], url[start + 3 :]
    if "@" not in body:  # no user-info
        return head, None, body
    netloc_end = min((i for i in (body.find(c) for c in "/?#") if i >= 0), default=len(body))
    if netloc_end == 0:  # no authority (sqlite:///a@b.db)
        return head, None, body
    at = body.rfind("@")
    return head, body[:at], body[at + 1 :]


def _mask_query(query: str) -> str:
    pairs = []
    for pair in query.split("&"):
        name, eq, _value = pair.partition("=")
        pairs.append(f"{name}={MASK}" if eq and is_secret_option(name) else pair)
    return "&".join(pairs)


def mask_url(url: str) -> str:
    """``url`` with every secret replaced by ``***``: the password of the user-info (all of
    the user-info when it cannot be split safely), the value of every secret-bearing query
    option (:func:`is_secret_option`) and the fragment."""
    if not isinstance(url, str):
        return "<not a URL string>"
    head, userinfo, rest = _split_userinfo(url)
    if userinfo is not None:
        if any(c in userinfo for c in "/?#"):  # ambiguous: where the password ends is unknown
            head += f"{MASK}@"
        elif ":" in userinfo:
            head += f"{userinfo.split(':', 1)[0]}:{MASK}@"
        else:
            head += f"{userinfo}@"  # a user name alone
    rest, hash_, fragment = rest.partition("#")
    path, question, query = rest.partition("?")
    masked = head + path + question + (_mask_query(query) if question else "")
    return masked + (f"#{MASK}" if hash_ and fragment else hash_)


@dataclass(frozen=True)
class BackendURL:
    """A parsed backend URL. ``options`` holds the query-string options jobfence reads.

    Its ``repr`` shows the masked URL only (``raw``, ``password`` and ``options`` may hold
    secrets); show :attr:`masked`, never ``raw``.
    """

    raw: str = field(repr=False)
    scheme: str
    host: str | None
    port: int | None
    username: str | None
    password: str | None = field(repr=False)
    path: str
    options: dict[str, str] = field(default_factory=dict, repr=False)

    def __repr__(self) -> str:
        return f"BackendURL({self.masked!r})"

    @property
    def masked(self) -> str:
        return mask_url(self.raw)

    @property
    def secrets(self) -> tuple[str, ...]:
        """Every secret of the URL (decoded and as written), longest first."""
        found = {self.password} if self.password else set()
        parts = urlsplit(self.raw)
        if parts.password:
            found.add(parts.password)
        for pair in parts.query.split("&"):
            name, eq, value = pair.partition("=")
            if eq and value and is_secret_option(name):
                found |= {value, unquote(value), unquote(value.replace("+", " "))}
        return tuple(sorted(found, key=len, reverse=True))

    def redact(self, text: str) -> str:
        """``text`` with every secret of this URL replaced by ``***`` (for a driver's message)."""
        for secret in self.secrets:
            text = text.replace(secret, MASK)
        return text

    def pop_option(self, name: str, default: str | None = None) -> str | None:
        return self.options.get(name, default)

    def without_options(self, *names: str) -> str:
        """The raw URL with the given query options removed (for handing to a driver)."""
        parts = urlsplit(self.raw)
        kept = [(k, v) for k, v in parse_qsl(parts.query, keep_blank_values=True) if k not in names]
        query = "&".join(f"{quote(k)}={quote(v)}" for k, v in kept)
        return urlunsplit((parts.scheme, parts.netloc, parts.path, query, parts.fragment))


def parse_url(url: object, *, argument: str = "url", many_hosts: bool = False) -> BackendURL:
    """Parse a backend URL (any scheme); raise :class:`ConfigurationError` naming ``argument``
    when it is not a URL, or its user-info, host or port cannot be read.

    ``many_hosts``: the URL may name several hosts (``h1:26379,h2:26379``), which its backend
    reads from ``netloc``; its ``port`` is then ``None``. The registry says which schemes may.

    Messages show the URL masked (:func:`mask_url`) and never quote the parser's own message,
    which can hold part of a password.
    """
    if not isinstance(url, str) or not url:
        raise ConfigurationError(
            f"{argument} must be a non-empty URL string such as 'redis://localhost:6379/0', "
            f"'sqlite:///path/to/file.db' or 'memory://'; got {url!r}",
            argument=argument,
        )
    head, userinfo, _rest = _split_userinfo(url)
    if head and userinfo is not None and any(c in userinfo for c in "/?#"):
        raise ConfigurationError(
            f"{argument} has an '@' after its host part, so where its user name and password "
            f"end is ambiguous: {_HINT} (and '@' in a query value as %40): {mask_url(url)}",
            argument=argument,
        )
    try:
        parts = urlsplit(url)
        many = many_hosts and "," in parts.netloc
        port = None if many else parts.port
    except ValueError:
        raise ConfigurationError(
            f"{argument} is not a valid URL: its host or port cannot be read ({_HINT}; a port "
            f"is a number from 0 to 65535): {mask_url(url)}",
            argument=argument,
        ) from None
    scheme = parts.scheme.lower()
    options = dict(parse_qsl(parts.query, keep_blank_values=True))
    return BackendURL(
        raw=url,
        scheme=scheme,
        host=None if many else parts.hostname,
        port=port,
        username=unquote(parts.username) if parts.username else None,
        password=unquote(parts.password) if parts.password else None,
        path=unquote(parts.path),
        options=options,
    )
