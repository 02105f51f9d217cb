int slotserve_placeholder(void) { return 0; }
