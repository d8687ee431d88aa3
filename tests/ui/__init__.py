"""Real-browser tests: `lockstep demo` started as a user
would, driven by Playwright on Debian's chromium."""
