# placeholder, replaced by the engine
def kernel_variant():
    return "scalar"
