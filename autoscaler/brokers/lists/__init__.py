"""Plain Redis lists and streams of any producer: their readers (`redis_list`)."""
