"""Stand-in for ModelLoader.load's weight steps (TensorRT-LLM 1.1.0 and 1.2.1, model_loader.py@b51992a3; not
TensorRT-LLM): load_weights, then post_load_weights on every module that has it."""


def load(model, weights_by_module):
    for name, module in model.named_modules():
        if name in weights_by_module:
            module.load_weights(weights_by_module[name])
    for module in model.modules():
        if hasattr(module, "post_load_weights") and not getattr(module, "_weights_removed", False):
            module.post_load_weights()
    return model
