"""The rollout server's shared secret: where both sides read it, when ``policyzoo serve`` needs it, and
the ASGI middleware that makes the server refuse every request without it.

``policyzoo serve`` turns on vLLM's dev routes (``VLLM_SERVER_DEV_MODE=1``: ``/collective_rpc``, the
weight-transfer routes, ``/reset_prefix_cache``), which vLLM leaves unauthenticated: whoever reaches
the port can replace the weights or call worker methods. vLLM's own ``--api-key`` (vllm 0.32,
``vllm/entrypoints/serve/middleware/authenticate.py``) guards only paths under ``/v1``, ``/v2``,
``/inference`` and ``/cohere``, and takes the key on the command line, where ``ps`` shows it to every
user of the machine. So:

* **The secret** (:func:`resolve_token`) comes from a token file (``policyzoo serve --token-file``,
  the trainer's ``engine.server_token_file``) that only its owner may read (mode ``0o600`` or
  stricter; any group/other bit is refused, as ssh refuses a private key), or from the environment
  variable :data:`TOKEN_ENV`; never from a command-line value or the config itself (the run
  directory's ``resolved.yaml`` holds the file's path, not the secret). At least
  :data:`MIN_TOKEN_CHARS` visible ASCII characters.
* **Binding**: ``policyzoo serve`` refuses a host other than loopback (:func:`is_loopback`:
  127.0.0.0/8, ``::1``, ``localhost``) without a secret.
* **The server** (:class:`BearerTokenMiddleware`, given to vLLM as ``--middleware``; it reads the
  secret from :data:`TOKEN_ENV`, which ``policyzoo serve`` sets in the server's environment): every
  HTTP request and websocket of every route (the OpenAI routes, the dev routes, ``/health``,
  ``/metrics``, ``/docs``; ``OPTIONS`` included) answers 401 without ``Authorization: Bearer
  <secret>``; the comparison takes constant time (``hmac.compare_digest``).
* **The trainer** sends the header on every request (``server.py``) and turns a 401/403 into a
  :class:`~policyzoo.errors.UserError` (:func:`refused`).

Not covered: the secret travels in clear over HTTP, and the weight group itself (the trainer's
``TCPStore`` and the gloo/NCCL connections it brokers) has no secret; keep the network between the
trainer and its servers private.
"""

from __future__ import annotations

import hmac
import ipaddress
import json
import os
import stat
from pathlib import Path

from policyzoo.errors import UserError

#: the environment variable holding the secret, on the server and on the trainer
TOKEN_ENV = "POLICYZOO_SERVER_TOKEN"
#: the shortest secret accepted (characters)
MIN_TOKEN_CHARS = 16
#: how to make a token file, in every error about one
MAKE_TOKEN = "(umask 077; python -c 'import secrets; print(secrets.token_urlsafe(32))' > FILE)"


def is_loopback(host: str) -> bool:
    """True for ``localhost`` and addresses in 127.0.0.0/8 or ``::1`` (brackets allowed); False for
    anything else, ``0.0.0.0``, ``""`` (every interface) and other host names included."""
    text = (host or "").strip().removeprefix("[").removesuffix("]")
    if text.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(text).is_loopback
    except ValueError:
        return False


def _checked(token: str, where: str) -> str:
    if len(token) < MIN_TOKEN_CHARS or not all(33 <= ord(c) <= 126 for c in token):
        raise UserError(where, f"the token must be at least {MIN_TOKEN_CHARS} visible ASCII characters (no spaces; "
                        f"this one has {len(token)} characters)", f"make one: {MAKE_TOKEN}")
    return token


def read_token_file(path: str | os.PathLike, where: str) -> str:
    """The secret in ``path`` (surrounding whitespace stripped). Raises :class:`UserError` at
    ``where`` if the file is missing, not a regular file, readable or writable by group or others
    (the fix: ``chmod 600``), or holds no valid token (:data:`MIN_TOKEN_CHARS`)."""
    p = Path(path).expanduser()
    try:
        st = p.stat()
    except OSError as e:
        raise UserError(where, f"the token file {p} cannot be read: {e.strerror or e}",
                        f"give an existing file; make one: {MAKE_TOKEN}") from e
    if not stat.S_ISREG(st.st_mode):
        raise UserError(where, f"the token file {p} is not a regular file", f"make one: {MAKE_TOKEN}")
    if st.st_mode & 0o077:
        raise UserError(where, f"the token file {p} is open to group or others (mode {stat.filemode(st.st_mode)}): "
                        "anyone who can read it can replace the server's weights", f"chmod 600 {p}")
    try:
        text = p.read_text().strip()
    except (OSError, UnicodeDecodeError) as e:
        raise UserError(where, f"the token file {p} cannot be read: {e}", f"make one: {MAKE_TOKEN}") from e
    return _checked(text, f"{where} ({p})")


def resolve_token(token_file: str | os.PathLike | None, env: dict | None = None, *,
                  where: str = "the rollout server's token") -> str | None:
    """The shared secret, or None when neither ``token_file`` nor :data:`TOKEN_ENV` (in ``env``,
    default ``os.environ``) is set. Both set to different secrets is refused (no silent choice)."""
    env = os.environ if env is None else env
    from_file = read_token_file(token_file, where) if token_file else None
    from_env = env.get(TOKEN_ENV)
    if from_env is not None:
        from_env = _checked(from_env.strip(), f"{where} ({TOKEN_ENV})")
    if from_file and from_env and not hmac.compare_digest(from_file, from_env):
        raise UserError(where, f"the token file {token_file} and {TOKEN_ENV} hold different tokens",
                        f"unset {TOKEN_ENV} or give the file that holds it")
    return from_file or from_env


def check_bind(host: str, token: str | None) -> None:
    """Refuse a non-loopback ``host`` without a secret (``policyzoo serve``)."""
    if token is None and not is_loopback(host):
        raise UserError(f"policyzoo serve --host {host}", "a host other than loopback (127.0.0.0/8, ::1, localhost) "
                        "needs a shared secret: without one, anyone who reaches the port can replace the weights "
                        "and call worker methods (vLLM's /collective_rpc and weight-transfer routes)",
                        f"set one in a file only you can read and pass --token-file FILE ({MAKE_TOKEN}), or "
                        f"export {TOKEN_ENV}; the trainer reads the same secret ({TOKEN_ENV} or "
                        "engine.server_token_file). Or bind --host 127.0.0.1")


def auth_headers(token: str | None) -> dict:
    """The header the trainer sends on every request (none without a secret)."""
    return {"Authorization": f"Bearer {token}"} if token else {}


def refused(url: str, sent: bool, cls: type[UserError] = UserError) -> UserError:
    """The error (a ``cls``) of a server that answered 401/403: the token is missing (``sent``
    False) or wrong."""
    why = "refused the token" if sent else "asks for a token and none was sent"
    return cls(f"the rollout server at {url}", f"it {why} (HTTP 401/403)",
                     f"set {TOKEN_ENV} (or engine.server_token_file) to the server's token")


class BearerTokenMiddleware:
    """Pure ASGI middleware: every ``http`` and ``websocket`` request without ``Authorization:
    Bearer <secret>`` gets 401 (a websocket is closed before it is accepted: HTTP 403); lifespan
    events pass. The secret is :data:`TOKEN_ENV` of the server's environment; the server does not
    start without one (fail closed). vLLM adds it with ``app.add_middleware`` (``--middleware``)."""

    def __init__(self, app) -> None:
        self.app = app
        token = os.environ.get(TOKEN_ENV)
        if not token:
            raise RuntimeError(f"{TOKEN_ENV} is not set in the server's environment (policyzoo serve sets it)")
        self.token = token.strip().encode()

    def _allowed(self, scope) -> bool:
        for key, value in scope.get("headers") or ():
            if key.lower() == b"authorization":
                scheme, _, rest = value.partition(b" ")
                return scheme.lower() == b"bearer" and hmac.compare_digest(rest.strip(), self.token)
        return False

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] not in ("http", "websocket") or self._allowed(scope):
            await self.app(scope, receive, send)
        elif scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1008})
        else:
            body = json.dumps({"error": f"unauthorized: send Authorization: Bearer <token> ({TOKEN_ENV})"}).encode()
            await send({"type": "http.response.start", "status": 401,
                        "headers": [(b"content-type", b"application/json"), (b"www-authenticate", b"Bearer"),
                                    (b"content-length", str(len(body)).encode())]})
            await send({"type": "http.response.body", "body": body})
