"""The front end: http/ (the request pipeline every route takes, the app), routes/ (one module per
route family), media/ (images and audio), cli/ (the swama command). It reaches the engine through
engine/client.py only."""
