"""The node agent: the kubelet's DRA device-health pipeline.

Plugin watcher (registration handshake), plugin registry (one authoritative health
stream per driver), health stream client, durable health store, claim tracker and
the agent that ties them to the API server (kubelet mode) or runs beside a real
kubelet (observer mode). The sans-I/O rules (health cache, status builder) live in
``drahealth.core``. See docs/agent.md.
"""
