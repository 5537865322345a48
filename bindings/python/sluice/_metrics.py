"""sluice.serve_metrics: the library's HTTP metrics endpoint
(sluice_metrics_serve), for a Prometheus server to scrape."""
from . import _features, _sluice


class MetricsServer:
    """An HTTP endpoint serving GET /metrics for the models added to it
    (Prometheus text 0.0.4, or OpenMetrics when the scraper asks for it).
    A context manager; close() stops it (idempotent).

    A model added stays open in the library while it is served, even after
    Model.close() (the library wants a model removed before it is closed):
    remove() it, or close the server, and its deferred close happens."""

    def __init__(self, core):
        self._s = core

    @property
    def port(self):
        """The TCP port listened on (the one chosen when port=0); 0 once closed."""
        return self._s.port

    def add(self, model):
        """Serves model's metrics too (at most 64 models; each label, its
        location by default, once). Adding a model twice serves it once."""
        self._s.add(_core_of(model))

    def remove(self, model):
        """Stops serving model (NotFoundError when it is not served)."""
        self._s.remove(_core_of(model))

    def close(self):
        self._s.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self):
        return f"<sluice.MetricsServer port={self.port}>"


def _core_of(model):
    core = getattr(model, "_m", None)
    if not isinstance(core, _sluice.Model):
        raise TypeError(f"expected a sluice.Model, not {type(model).__name__}")
    return core


def serve_metrics(port=0, host="127.0.0.1", models=()):
    """Listens on host (an IPv4 or IPv6 literal) and port (0: a free one,
    see .port) and serves the metrics of models (more with .add()).
    Raises UnsupportedError when this build has no libmicrohttpd, ReadError
    when it cannot listen (the port taken)."""
    _features.require("metrics_http")
    if not isinstance(host, str):
        raise TypeError(f"host must be a str, not {type(host).__name__}")
    if isinstance(port, bool) or not isinstance(port, int):
        raise TypeError(f"port must be an int, not {type(port).__name__}")
    if not 0 <= port <= 65535:
        raise ValueError(f"port {port} is not a TCP port (0..65535)")
    server = MetricsServer(_sluice.serve_metrics(host, port))
    try:
        for m in models:
            server.add(m)
    except BaseException:
        server.close()
        raise
    return server
