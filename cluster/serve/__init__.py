"""The Ray Serve application: app builder, ingress adapter, role clients, stats board, pools."""
