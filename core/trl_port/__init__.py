"""``policyzoo.from_trl``: a TRL ``GRPOConfig`` ported key by key (docs/glossary.md, "Coming from TRL")."""

from .port import Port, TrlConfig, from_trl, port_trl

__all__ = ["Port", "TrlConfig", "from_trl", "port_trl"]
