"""Event handlers: plain functions of the services and the inputs, testable without Gradio."""
