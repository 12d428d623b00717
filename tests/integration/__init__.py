"""End-to-end tests: real gpulayerd processes on temporary state dirs, driven through the CLI."""
