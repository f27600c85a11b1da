"""Native code shipped prebuilt: the PNG unfilter kernel (unfilter.c) and the script that builds it."""
