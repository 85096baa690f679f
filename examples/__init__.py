"""Example jobs that need no download, for `python -m gearshift.worker.run --job ...`.

- gearshift.examples.digits_cnn: small CNN (dropout, BatchNorm, random augmentation) on
  scikit-learn's digits; SGD with momentum or Adam; step LR.
- gearshift.examples.tiny_lm: small transformer language model with dropout on synthetic
  text; Adam; step LR.
- gearshift.examples.mlp: MLP on synthetic clusters; SGD with momentum or Adam; step LR.
- gearshift.examples.resnet: ResNet-style CNN (BatchNorm, dropout, random shifts and flips)
  on synthetic images; SGD with momentum; step LR. Sized up, it keeps a GPU busy.
"""
