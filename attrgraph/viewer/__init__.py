"""The graph viewer: a page that draws attribution graphs and component circuits.

  server.py            `attrgraph serve FILE`: a local HTTP server (127.0.0.1) for the page and its JSON
  access.py            who may talk to it: exact Host allowlist, Origin, the token beyond loopback
  payload.py           a graph as the page's JSON (the view: pruned when huge; labels; dashboards)
  circuit_payload.py   a stored component circuit as the page's JSON
  dashboards.py        the view's note on which dashboards label a graph's features (graph/dashboard_lookup.py)
  supernode_request.py the page's request to store supernodes, checked before anything is written
  label_request.py     the page's request to set feature labels (saved as transcoders.set_labels does)
  notebook.py          `attrgraph.show(graph)`: the same page, self-contained, inside Jupyter
  static/              index.html, viewer.js, viewer.css: plain JavaScript and SVG, no libraries

It reads the HDF5 file directly and writes only supernodes back (and feature labels into the
dashboards file), through the one atomic writer (graph/store.py `edit_h5`).
"""
