"""Images and audio as requests send them and responses carry them: checked by their bytes, decoded,
encoded; shared by the routes and the command line."""
