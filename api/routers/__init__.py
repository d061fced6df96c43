"""One router per resource: health, tables (v1), the KServe v2 protocol, admin."""
