"""Looking inside a trained model: its attention weights and positional encoding for a sentence (`maps`), drawn as
pictures (`figures`), and the attention explorer, a Gradio app over one model (`app`, `vaswani-demo`)."""
