"""`pipeline("translation", model=..., trust_remote_code=True)` for vaswani models.

transformers 5 removed its built-in translation pipeline; a saved vaswani folder declares this one in its config
(`custom_pipelines`), and the library loads it from the folder like the model's own code. It takes one text or a list
of texts and answers `[{"translation_text": ...}]` per text, as the built-in pipeline did (a list of such answers per
text with `num_return_sequences` > 1). Decoding follows the model's generation config (the paper's beam 4 and length
penalty 0.6) unless the call passes other `generate()` arguments.
"""

from transformers import Pipeline


class VaswaniTranslationPipeline(Pipeline):
    """Section 6.1 as a pipeline: tokenize the source, decode with `generate()`, detokenize the best hypothesis."""

    _pipeline_calls_generate = True
    _load_tokenizer = True
    _load_processor = False
    _load_image_processor = False
    _load_feature_extractor = False

    def __call__(self, texts: str | list[str], **kwargs):
        """One text: a list of `num_return_sequences` answers. A list of texts: one answer per text, or a list of
        `num_return_sequences` answers per text when that is more than one (the removed built-in's shapes)."""
        results = super().__call__(texts, **kwargs)
        if isinstance(texts, list) and all(len(result) == 1 for result in results):
            return [result[0] for result in results]
        return results

    def _sanitize_parameters(self, max_source_length=None, generate_kwargs=None, **generation_parameters):
        preprocess_kwargs = {} if max_source_length is None else {"max_source_length": max_source_length}
        return preprocess_kwargs, {**(generate_kwargs or {}), **generation_parameters}, {}

    def preprocess(self, text: str, max_source_length: int | None = None):
        if not isinstance(text, str):
            raise ValueError(f"The translation pipeline takes text (or a list of texts), got {type(text).__name__}.")
        return self.tokenizer(
            text, return_tensors="pt", truncation=max_source_length is not None, max_length=max_source_length
        )

    def _forward(self, model_inputs, **generate_kwargs):
        generate_kwargs = self._prepare_generate_kwargs(generate_kwargs)
        return {"output_ids": self.model.generate(**model_inputs, **generate_kwargs)}

    def postprocess(self, model_outputs):
        texts = self.tokenizer.batch_decode(model_outputs["output_ids"], skip_special_tokens=True)
        return [{"translation_text": text} for text in texts]
