#ifndef DOCFS_CLIBCRYPTO_SHIM_H
#define DOCFS_CLIBCRYPTO_SHIM_H

// OpenSSL's libcrypto (Debian's libssl-dev), for SHA-256 only.
#include <openssl/sha.h>

#endif
