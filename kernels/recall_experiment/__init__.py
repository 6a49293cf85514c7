"""Synthetic recall experiment: does a needle key stay in the DSA indexer's top-512 with fp8+scale vs bf16 keys?"""
