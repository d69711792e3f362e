"""A Diffusers pipeline on device "tpu": DDIM sampling with a small UNet, eager and under
torch.compile(backend="tpu"), against the same pipeline on CPU; saves the images as a PNG.

    python examples/diffusion.py
    python examples/diffusion.py --model PATH     # a local DDPM/DDIM pipeline directory

With no --model the UNet has random weights (nothing is downloaded), so the images are noise
shaped by an untrained network: what the example shows is that the tpu run, eager and
compiled, gives CPU's images (matmul precision "highest"; within the spread CPU shows
against itself with another thread count), and how long each takes.
"""
import argparse
import copy
import time

import torch


def build(args):
    from diffusers import DDIMPipeline, DDIMScheduler, UNet2DModel
    if args.model:
        return DDIMPipeline.from_pretrained(args.model)
    torch.manual_seed(0)
    unet = UNet2DModel(sample_size=args.size, in_channels=3, out_channels=3, layers_per_block=1,
                       block_out_channels=(32, 64, 64),
                       down_block_types=("DownBlock2D", "AttnDownBlock2D", "DownBlock2D"),
                       up_block_types=("UpBlock2D", "AttnUpBlock2D", "UpBlock2D"),
                       norm_num_groups=8)
    return DDIMPipeline(unet=unet, scheduler=DDIMScheduler(num_train_timesteps=1000))


def sample(pipe, args):
    gen = torch.Generator().manual_seed(args.seed)  # noise drawn on the CPU: the same everywhere
    t0 = time.perf_counter()
    images = pipe(batch_size=args.batch, generator=gen, num_inference_steps=args.steps,
                  output_type="np").images
    return torch.from_numpy(images), time.perf_counter() - t0


def save_grid(images, path):
    import numpy as np
    from PIL import Image
    row = np.concatenate(list(images.numpy()), axis=1)
    Image.fromarray((row.clip(0, 1) * 255).round().astype("uint8")).save(path)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default=None)
    p.add_argument("--size", type=int, default=32)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default="diffusion.png")
    args = p.parse_args()
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.set_float32_matmul_precision("highest")
    from diffusers.utils import logging
    logging.set_verbosity_error()

    pipe = build(args)
    want, t_cpu = sample(pipe, args)
    print(f"cpu          {t_cpu:6.2f} s for {args.batch} images of {args.size}x{args.size}, "
          f"{args.steps} steps")
    # the sampler amplifies rounding (x0 = (x - sqrt(1-a) eps) / sqrt(a), clipped, 20 times):
    # CPU against itself with another thread count shows how much
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    want1, _ = sample(pipe, args)
    torch.set_num_threads(threads)
    spread = (want1 - want).abs().max().item()
    print(f"cpu, 1 thread against {threads}: max difference {spread:.2e} (the sampler's "
          f"amplification of rounding)")
    tol = max(1e-3, 4 * spread)
    tpu = copy.deepcopy(pipe).to("tpu")
    got, t_eager = sample(tpu, args)
    print(f"tpu eager    {t_eager:6.2f} s   max |tpu - cpu| = {(got - want).abs().max():.2e}")
    tpu.unet = torch.compile(tpu.unet, backend="tpu")
    _, t_first = sample(tpu, args)
    got_c, t_comp = sample(tpu, args)
    print(f"tpu compiled {t_comp:6.2f} s (first call {t_first:.2f} s, compiling)   "
          f"max |tpu - cpu| = {(got_c - want).abs().max():.2e}")
    ok = torch.allclose(got, want, atol=tol) and torch.allclose(got_c, want, atol=tol)
    print(f"images equal to CPU's within {tol:.1e}: {ok}; eager {t_cpu / t_eager:.2f}x, "
          f"compiled {t_cpu / t_comp:.2f}x CPU's speed")
    save_grid(got_c, args.out)
    print(f"images: {args.out}")


if __name__ == "__main__":
    main()
