"""Code copied INTO THE PRODUCTION IMAGE and run there at build time (standard library only, plus pdstack.errors).

p2p.py is the P2P gate, run in the serving image on a GPU host (it imports torch, the image's, when it measures).
patches.py applies the SGLang patch series to the image's installed SGLang (images/prod/Dockerfile runs
`python3 -m pdstack.image.patches`). The build context carries exactly pdstack/__init__.py, pdstack/errors.py and this
package, nothing else of pdstack.
"""
