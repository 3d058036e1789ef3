// Header-only; SwiftPM needs a source file for a C target.
#include "CLinuxSupport.h"
