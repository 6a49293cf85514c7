"""Code copied INTO THE PRODUCTION IMAGE and run there at build time (standard library only, plus pdstack.errors).

patches.py applies the SGLang patch series to the image's installed SGLang (images/prod/Dockerfile runs
`python3 -m pdstack.image.patches`). The build context carries exactly pdstack/__init__.py, pdstack/errors.py and this
package, nothing else of pdstack.
"""
