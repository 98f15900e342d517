"""The input layer: what every command, config reader and settings module uses to read what the user names (files,
integers within the kernel types they end up in), beneath everything that reads input, so that each reads it the
same way and refuses it in the same words."""
