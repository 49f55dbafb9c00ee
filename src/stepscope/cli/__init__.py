"""Thin command modules: parse options, call one library function, print. No measurement logic here."""
