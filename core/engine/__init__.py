"""policyzoo.engine"""
