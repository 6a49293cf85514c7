"""`invoke build`: the serving image (prod) and the test-engine image (sim), content-addressed.

One module per concern:

    pipeline.build(flavor, base, save, push)   build (or find) the image; write the manifest
    inputs.compute_inputs(flavor, base_ref)    every input file's sha256 + pins -> the tag
    pins                                       versions read from requirements/ and images/bases.yaml
    engine                                     the Docker client, image_exists, the docker-build streamer
    rootfs                                     debootstrap a root file system and `docker import` it (shared with
                                               pdstack.testing.testhost's base image)
    wheels                                     the host-side wheel cache (build/wheels) and pure wheels of our code
    bases                                      the python base (debootstrap) and our locked CUDA base
    sbom                                       the CycloneDX SBOM of the locked base's distributions
    contexts                                   the docker build context of each flavor
    manifest                                   labels check, the manifest file, the table for people
    common                                     paths, BuildError, progress output, hashing, the build locks
    ship                                       docker save (+ sha256) and push

The image tag is the first 16 hex digits of a sha256 over every input: the Dockerfile and the files it copies,
the patch series (series file + the patches it lists), the kernel sources, the pinned versions, and the base
reference. When an image with that tag exists, `build` only rewrites the manifest (a no-op; well under 5 s).
"""
